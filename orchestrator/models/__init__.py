"""Example models implementing :class:`orchestrator.worker.model_api.LayeredModel`.

Importing this package does not import torch; import ``orchestrator.models.gpt`` for the GPT.
"""

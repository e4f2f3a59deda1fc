"""Kubernetes operators for orchestrator jobs (see :mod:`operators.hetero`)."""

"""orchestrator: plan, run and adapt PyTorch training on mixed and changing GPU clusters."""

__version__ = "0.1.0"

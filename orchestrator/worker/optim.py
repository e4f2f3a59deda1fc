"""Optimizers, one per planner layer.

Adam and SGD update each parameter from its own gradient and state, so a per-layer optimizer
computes what one optimizer over the whole model computes, and its state saves and loads by layer
index whatever the stage boundaries (no gradient clipping, which would need a global norm).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from orchestrator.errors import SpecError

OPTIMIZERS = ("adam", "sgd")


def make_optimizer(
    name: str, params: Iterable[torch.nn.Parameter], learning_rate: float
) -> torch.optim.Optimizer:
    """``adam`` (torch defaults otherwise) or ``sgd`` with momentum 0.9."""
    if name == "adam":
        return torch.optim.Adam(params, lr=learning_rate)
    if name == "sgd":
        return torch.optim.SGD(params, lr=learning_rate, momentum=0.9)
    raise SpecError(
        f"unknown optimizer {name!r}",
        field="training.optimizer",
        fix=f"use one of {', '.join(OPTIMIZERS)}",
    )

"""Refuse to apply a step whose loss or gradients are not finite.

Called once per step, after the gradient all-reduce and before the optimizer update. Each rank
checks what it holds (the loss on a last stage; its gradients' total norm), and one all-reduce
(MAX of two flags over the world group) makes every rank reach the same verdict, so either all
ranks apply the step or none does. A bad step then either stops training with
:class:`~orchestrator.errors.NonFiniteStepError` naming the step and the likely cause, or, while
the job's budget ``training.skip_nonfinite_steps`` lasts, is skipped: every gradient is dropped,
so the optimizer's update leaves weights and optimizer state exactly as they were (PyTorch's
optimizers skip parameters without a gradient), as large-scale trainers skip loss spikes.
Checkpoints are taken from committed weights, which therefore never hold NaN or infinity.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.errors import NonFiniteStepError

log = logging.getLogger(__name__)


class FiniteGuard:
    """Per-rank verdict on each step; ``max_skips`` bad steps may be skipped before stopping."""

    def __init__(self, max_skips: int = 0, learning_rate: float | None = None) -> None:
        if max_skips < 0:
            raise ValueError("max_skips must be >= 0")
        self.max_skips = max_skips
        self.learning_rate = learning_rate
        self.skipped_steps: list[int] = []

    def check(
        self,
        step: int,
        loss: float | None,
        layers: Mapping[int, nn.Module],
        device: torch.device,
        extra_grads: Sequence[torch.Tensor] = (),
    ) -> bool:
        """True when the step may be applied; False when it was skipped (gradients dropped).
        ``extra_grads``: gradients held outside the layers (sharded slices), checked too."""
        # A tensor-parallel slice is checked as this rank's local tensor (the flags are
        # all-reduced below, so every slice is seen).
        grads = [
            _local(p.grad)
            for layer in layers.values()
            for p in layer.parameters()
            if p.grad is not None
        ] + list(extra_grads)
        grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        flags = torch.tensor(
            [
                float(loss is not None and not math.isfinite(loss)),
                float(not math.isfinite(grad_norm)),
            ],
            device=device,
        )
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        bad_loss, bad_grad = (bool(v) for v in flags.tolist())
        if not (bad_loss or bad_grad):
            return True
        what = "loss" if bad_loss else "gradient norm"
        self.skipped_steps.append(step)
        if len(self.skipped_steps) > self.max_skips:
            raise NonFiniteStepError(self._message(step, what), step=step)
        for layer in layers.values():
            for p in layer.parameters():
                p.grad = None
        log.warning(
            "step %d skipped: non-finite %s (%d of %d allowed skips used)",
            step,
            what,
            len(self.skipped_steps),
            self.max_skips,
        )
        return False

    def _message(self, step: int, what: str) -> str:
        lr = f" ({self.learning_rate:g})" if self.learning_rate is not None else ""
        used = (
            f"; {self.max_skips} such step(s) already skipped (training.skip_nonfinite_steps)"
            if self.max_skips
            else ""
        )
        return (
            f"step {step}: non-finite {what}; the update was not applied and nothing was "
            f"checkpointed from it{used}. Likely cause: a learning rate{lr} too high for this "
            "model, or bad values in the data (fix it and resume from the last checkpoint, or "
            "set training.skip_nonfinite_steps to skip a few such steps)"
        )


def _local(grad: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return grad.to_local() if isinstance(grad, DTensor) else grad

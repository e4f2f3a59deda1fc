"""Training precision: fp32, or bf16/fp16 compute over fp32 master weights, and loss scaling.

16-bit compute uses ``torch.autocast`` rather than 16-bit working copies of the layers. The
parameters, their gradients and the optimizer state stay fp32 (the master weights) and autocast
casts the weights of matmul-like ops to the compute dtype as they run; with one autocast region
around a whole step, each weight is cast once per step and the cast is shared by every
microbatch (autocast's weight-cast cache, cleared when the region ends). This needs no second
copy of the model to keep in sync, keeps per-layer optimizers and layer-indexed checkpoints
exactly as in fp32, and leaves numerically sensitive ops (softmax, cross-entropy, reductions) to
autocast's fp32 lists. Backward runs outside autocast (``no_autocast``), as PyTorch recommends;
its ops follow the dtypes the forward chose.

Tensors that cross a stage boundary travel in the compute dtype (half the bytes of fp32, as the
cost model assumes).

fp16 has a narrow exponent range, so its gradients are computed on ``loss x scale``
(:class:`DynamicLossScaler`, the semantics of ``torch.amp.GradScaler``: start at 2^16, halve and
skip the step when any gradient anywhere is inf/NaN, double after 2000 clean steps). It is our own
rather than ``GradScaler`` because the decision must be one for the whole pipeline: every rank of
every stage skips the same step, which takes one all-reduce of the overflow flag over the world
(``GradScaler`` decides per process, from the optimizers that process holds).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import torch

from orchestrator.errors import SpecError


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


COMPUTE_DTYPES = {
    Precision.FP32: torch.float32,
    Precision.BF16: torch.bfloat16,
    Precision.FP16: torch.float16,
}


def parse_precision(value: str) -> Precision:
    """``fp32``, ``bf16`` or ``fp16``; a :class:`SpecError` names the field otherwise."""
    try:
        return Precision(value)
    except ValueError:
        raise SpecError(
            f"unknown precision {value!r}",
            field="training.precision",
            fix=f"use one of {', '.join(p.value for p in Precision)}",
        ) from None


@dataclass(frozen=True)
class PrecisionPolicy:
    """What a rank computes in, and how."""

    precision: Precision
    device_type: str  # "cpu" or "cuda"

    @property
    def compute_dtype(self) -> torch.dtype:
        return COMPUTE_DTYPES[self.precision]

    @property
    def mixed(self) -> bool:
        return self.precision is not Precision.FP32

    @property
    def scales_loss(self) -> bool:
        return self.precision is Precision.FP16

    def boundary_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """Dtype of the tensors sent between stages: the compute dtype when 16-bit."""
        return self.compute_dtype if self.mixed else model_dtype

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The region forwards run in (nothing in fp32)."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.compute_dtype, cache_enabled=True)

    def no_autocast(self) -> contextlib.AbstractContextManager[None]:
        """Backward's region: autocast off, the weight-cast cache of the step kept."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, enabled=False)


@dataclass
class DynamicLossScaler:
    """Dynamic loss scale with ``torch.amp.GradScaler``'s defaults and update rule."""

    scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    _clean_steps: int = 0

    def update(self, overflow: bool) -> None:
        """After a step: back off on overflow, grow after ``growth_interval`` clean steps."""
        if overflow:
            self.scale *= self.backoff_factor
            self._clean_steps = 0
            return
        self._clean_steps += 1
        if self._clean_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self._clean_steps = 0

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "clean_steps": float(self._clean_steps)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale = float(state["scale"])
        self._clean_steps = int(state["clean_steps"])


def has_non_finite(grads: Iterable[torch.Tensor | None]) -> bool:
    """Whether any gradient holds an inf or NaN (one device sync, not one per tensor)."""
    flags = [torch.logical_not(torch.isfinite(g)).any() for g in grads if g is not None]
    if not flags:
        return False
    return bool(torch.stack(flags).any())


def unscale_(grads: Iterable[torch.Tensor | None], scale: float) -> None:
    """Divide gradients by the loss scale in place (exact for the power-of-two scales used)."""
    if scale == 1.0:
        return
    inv = 1.0 / scale
    assert math.isfinite(inv)
    for g in grads:
        if g is not None:
            g.mul_(inv)


class LossScaling:
    """fp16 loss scaling of one rank, deciding overflow together with every other rank."""

    def __init__(self, scaler: DynamicLossScaler | None = None) -> None:
        self.scaler = scaler or DynamicLossScaler()
        self._step_scale = self.scaler.scale
        self.overflowed = False

    @property
    def scale(self) -> float:
        """The scale this step's loss is multiplied by."""
        return self.scaler.scale

    def settle(self, grads: list[torch.Tensor | None], device: torch.device) -> bool:
        """After the gradient all-reduce: did any rank overflow? Updates the scale either way.

        The flag is all-reduced (MAX) over the world group, so every rank of every stage
        decides the same and the scale stays equal everywhere.
        """
        import torch.distributed as dist

        flag = torch.tensor([1.0 if has_non_finite(grads) else 0.0], device=device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.overflowed = bool(flag.item() > 0)
        self._step_scale = self.scaler.scale
        self.scaler.update(self.overflowed)
        return self.overflowed

    def unscale_(self, grads: list[torch.Tensor | None]) -> None:
        """Divide this step's gradients by the scale its loss was multiplied by."""
        unscale_(grads, self._step_scale)


# Key of the fp16 loss scaler's state inside each layer state a rank returns: checkpoints and
# re-plans move layer states, so the scale travels with them and a resumed or re-formed run
# continues at the scale (and the clean-step count) it had, as GradScaler's state_dict does.
LOSS_SCALE_KEY = "loss_scale"


def attach_loss_scale(states: dict[int, dict[str, object]], scaling: LossScaling | None) -> None:
    """Add the scaler's state to every layer state (fp16 only; a no-op otherwise)."""
    if scaling is None:
        return
    for state in states.values():
        state[LOSS_SCALE_KEY] = scaling.scaler.state_dict()


def restore_loss_scale(states: Iterable[dict[str, object]], scaling: LossScaling | None) -> bool:
    """Load the scaler's state from the first layer state that carries one; whether one did.
    All ranks of a run hold the same scale (overflow is decided over the world group)."""
    if scaling is None:
        return False
    for state in states:
        saved = state.get(LOSS_SCALE_KEY)
        if isinstance(saved, dict):
            scaling.scaler.load_state_dict(saved)
            return True
    return False

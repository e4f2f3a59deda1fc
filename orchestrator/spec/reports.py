"""What a training step reports: per-stage timings and the committed step, as plain data.

The worker group produces them, the controller commits them, the straggler policy reads the
stage timings, telemetry exports them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryUse:
    """What one rank held during a step, term by term (``worker/memory_account.py``).

    The terms the cost model predicts per rank: weights, gradients and optimizer state (distinct
    storages), the peak of activations saved for backward over the step's microbatches in flight,
    16-bit weight copies autocast keeps for the backward; on CUDA also the allocator's peak and the
    context outside it (None elsewhere).
    """

    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_peak_bytes: int
    activation_microbatch_bytes: int  # the most one microbatch saved
    microbatches_in_flight: int  # the most held at once
    cast_weight_bytes: int = 0
    device_peak_bytes: int | None = None
    context_bytes: int | None = None

    @property
    def state_bytes(self) -> int:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        """State, activations in flight and weight copies: the counted peak (no framework)."""
        return self.state_bytes + self.activations_peak_bytes + self.cast_weight_bytes


@dataclass(frozen=True)
class StageTiming:
    """What one stage of one replica measured during one step."""

    replica: int
    stage: int
    device_type: str
    compute_s: float  # forward + backward compute time of this stage during the step
    step_s: float  # wall time of the whole step on this rank
    memory: MemoryUse | None = None  # what the rank held (None: not counted)
    # Wall seconds of collectives run inside the compute (the layer-by-layer sharded path's
    # gathers and reductions, issued from the layers' hooks), part of ``compute_s``.
    collective_s: float = 0.0


@dataclass(frozen=True)
class StepReport:
    """One completed training step, as the worker group reports it (committed unless its update
    was skipped on an fp16 overflow)."""

    step: int
    loss: float
    step_duration_s: float
    samples: int
    stage_timings: tuple[StageTiming, ...] = ()
    # fp16: the gradients overflowed somewhere, so no rank applied the update (the controller
    # does not commit such a step: it runs it again at the lowered scale).
    overflow_skipped: bool = False
    loss_scale: float = 1.0  # the scale the step's loss was multiplied by (1.0 unless fp16)
    # Validation loss (training.eval_every) of the weights after ``eval_after_steps`` steps,
    # evaluated during this step's call; None when the step evaluated nothing.
    eval_loss: float | None = None
    eval_after_steps: int | None = None

    @property
    def throughput_samples_per_s(self) -> float:
        return self.samples / self.step_duration_s if self.step_duration_s > 0 else 0.0

"""What a training step reports: per-stage timings and the committed step, as plain data.

The worker group produces them, the controller commits them, the straggler policy reads the
stage timings, telemetry exports them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageTiming:
    """What one stage of one replica measured during one step."""

    replica: int
    stage: int
    device_type: str
    compute_s: float  # forward + backward compute time of this stage during the step
    step_s: float  # wall time of the whole step on this rank


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

    @property
    def throughput_samples_per_s(self) -> float:
        return self.samples / self.step_duration_s if self.step_duration_s > 0 else 0.0

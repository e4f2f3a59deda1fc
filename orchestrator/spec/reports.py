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
    """One completed (committed) training step, as the worker group reports it."""

    step: int
    loss: float
    step_duration_s: float
    samples: int
    stage_timings: tuple[StageTiming, ...] = ()

    @property
    def throughput_samples_per_s(self) -> float:
        return self.samples / self.step_duration_s if self.step_duration_s > 0 else 0.0

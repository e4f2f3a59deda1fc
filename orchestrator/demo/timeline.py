"""What the demo saw while the run went on: progress samples, the crash, the join.

Pure (no Ray): the runner feeds it, the summary reads it. Throughput is measured at the driver,
from wall-clock samples of the committed step count, so it includes every overhead a user sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sample:
    """Committed steps at a wall-clock time."""

    time_s: float
    steps: int


@dataclass
class PlanLog:
    """A plan put into effect: why, on which devices, predicted step time, per-replica lines."""

    time_s: float
    reason: str
    devices: dict[str, int]
    predicted_step_s: float
    replicas: list[str] = field(default_factory=list)


@dataclass
class Timeline:
    """Samples and the wall times of the demo's own actions."""

    global_batch_size: int
    samples: list[Sample] = field(default_factory=list)
    crashed_at_s: float | None = None
    crashed_node: str = ""
    crashed_at_step: int | None = None
    joined_at_s: float | None = None
    joined_node: str = ""
    joined_at_step: int | None = None
    plans: list[PlanLog] = field(default_factory=list)

    def record(self, time_s: float, steps: int) -> None:
        if not self.samples or steps != self.samples[-1].steps:
            self.samples.append(Sample(time_s, steps))

    def add_plan(self, time_s: float, plan: PlanLog) -> None:
        """Keep a plan the run put into effect (seen by the driver at ``time_s``)."""
        plan.time_s = time_s
        self.plans.append(plan)

    def throughput(self, start_s: float, end_s: float, skip_steps: int = 1) -> float | None:
        """Samples per second between ``start_s`` and ``end_s``, leaving out the first
        ``skip_steps`` steps of the window (a new plan's first step warms up)."""
        inside = [s for s in self.samples if start_s <= s.time_s <= end_s]
        if len(inside) <= skip_steps + 1:
            return None
        first, last = inside[skip_steps], inside[-1]
        if last.time_s <= first.time_s or last.steps <= first.steps:
            return None
        return (last.steps - first.steps) * self.global_batch_size / (last.time_s - first.time_s)


"""The demo's summary: plans before and after each change, loss, throughput, recovery, emulation.

:func:`build_summary` reads the controller's summary (its events carry every decision with its
numbers) and the driver's :class:`~orchestrator.demo.timeline.Timeline` (when the demo crashed and
added nodes, and the committed step count over time). Pure: no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.control.events import EventKind, RunEvent
from orchestrator.demo.scenario import DemoScenario
from orchestrator.demo.timeline import Timeline
from orchestrator.runtime.elastic.summary import RunSummary
from orchestrator.telemetry.status import event_to_json


@dataclass(frozen=True)
class PlanView:
    """A plan put into effect: why, on which devices, predicted step time, per-replica lines."""

    reason: str
    time_s: float
    devices: dict[str, int]
    predicted_step_s: float
    replicas: list[str]


@dataclass
class DemoSummary:
    """Everything the demo reports at the end (``--json`` prints it as it is)."""

    completed: bool
    state: str
    reason: str
    steps: int
    total_steps: int
    first_loss: float | None
    last_loss: float | None
    emulated: bool
    emulation: str
    profiles: list[dict[str, Any]]
    plans: list[PlanView]
    crash: dict[str, Any] | None
    join: dict[str, Any] | None
    throughput_samples_per_s: dict[str, float | None]
    failure_count: int
    lost_steps_total: int
    checkpoint_path: str
    workdir: str
    # Every Ray process the demo started ran under this directory (gone once it stopped them).
    ray_temp_dir: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    # Uniform data parallel (every worker the same share) on the starting nodes, costed by the
    # same cost model as the initial plan (demo/baseline.py); None when it was not computed.
    uniform_data_parallel: dict[str, Any] | None = None

    @property
    def loss_fell(self) -> bool:
        return (
            self.first_loss is not None
            and self.last_loss is not None
            and self.last_loss < self.first_loss
        )

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["loss_fell"] = self.loss_fell
        finite: dict[str, Any] = _finite(doc)
        return finite


def _finite(value: Any) -> Any:
    """NaN and infinities become null, so the JSON is standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _plan_views(timeline: Timeline) -> list[PlanView]:
    """Every plan put into effect, from the run's typed plan updates."""
    return [
        PlanView(
            reason=log.reason,
            time_s=log.time_s,
            devices=dict(log.devices),
            predicted_step_s=log.predicted_step_s,
            replicas=list(log.replicas),
        )
        for log in timeline.plans
    ]


def _after(events: Sequence[RunEvent], time_s: float, *kinds: EventKind) -> list[RunEvent]:
    return [e for e in events if e.kind in kinds and e.time_s >= time_s]


def _crash(timeline: Timeline, events: Sequence[RunEvent]) -> dict[str, Any] | None:
    if timeline.crashed_at_s is None:
        return None
    after = _after(events, timeline.crashed_at_s, EventKind.RECOVERY)
    recovered = [e for e in after if "recovery_s" in e.data]
    info: dict[str, Any] = {
        "node": timeline.crashed_node,
        "after_step": timeline.crashed_at_step,
        "recovered": bool(recovered),
    }
    if recovered:
        first = recovered[0]
        info["crash_to_first_step_s"] = first.time_s - timeline.crashed_at_s
        info["detected_to_first_step_s"] = _number(first.data["recovery_s"])
        info["lost_steps"] = int(_number(first.data["lost_steps"]))
        info["first_step_after"] = int(_number(first.data["step"]))
    info["restored"] = [e.message for e in after if "recovery_s" not in e.data][:2]
    return info


def _join(timeline: Timeline, events: Sequence[RunEvent]) -> dict[str, Any] | None:
    if timeline.joined_at_s is None:
        return None
    decisions = [
        e
        for e in _after(events, timeline.joined_at_s, EventKind.REPLAN, EventKind.REPLAN_SKIPPED)
        if e.data.get("trigger") == "join"
    ]
    info: dict[str, Any] = {
        "node": timeline.joined_node,
        "at_step": timeline.joined_at_step,
        "decision": decisions[0].kind.value if decisions else "none seen",
        "reason": decisions[0].message if decisions else "",
        "numbers": dict(decisions[0].data) if decisions else {},
        "switched": bool(decisions) and decisions[0].kind is EventKind.REPLAN,
    }
    if info["switched"]:
        measured = [
            e
            for e in _after(events, decisions[0].time_s, EventKind.PLAN_CHOSEN)
            if "switch_cost_s" in e.data
        ]
        if measured:
            info["join_to_first_step_s"] = measured[0].time_s - timeline.joined_at_s
            info["switch_cost_s"] = _number(measured[0].data["switch_cost_s"])
    return info


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _throughput(
    timeline: Timeline, crash: dict[str, Any] | None, join: dict[str, Any] | None, end_s: float
) -> dict[str, float | None]:
    """Samples per second in each phase: before the crash, after recovery, after the join."""
    first_s = timeline.samples[0].time_s if timeline.samples else 0.0
    crash_s = timeline.crashed_at_s
    join_s = timeline.joined_at_s
    recovered_s = None
    if crash_s is not None and crash and "crash_to_first_step_s" in crash:
        recovered_s = crash_s + float(crash["crash_to_first_step_s"])
    switched_s = None
    if join_s is not None and join and "join_to_first_step_s" in join:
        switched_s = join_s + float(join["join_to_first_step_s"])
    return {
        "initial": timeline.throughput(first_s, crash_s or join_s or end_s),
        "after_crash": (
            timeline.throughput(recovered_s, join_s or end_s) if recovered_s is not None else None
        ),
        "after_join": timeline.throughput(switched_s, end_s) if switched_s is not None else None,
    }


def emulation_text(scenario: DemoScenario) -> str:
    kinds = ", ".join(f"{k.device_type} at {k.emulated_speed:g}x" for k in scenario.all_kinds())
    return (
        f"emulated: every node is one CPU of this machine; device speeds are emulated by "
        f"stretching compute ({kinds} the fastest); no real GPU is used"
    )


def build_summary(
    scenario: DemoScenario,
    summary: RunSummary,
    timeline: Timeline,
    profiled: list[Any],
    workdir: Path,
    ray_temp_dir: str = "",
) -> DemoSummary:
    """The demo's summary from the controller's summary and the driver's timeline."""
    crash = _crash(timeline, summary.events)
    join = _join(timeline, summary.events)
    end_s = timeline.samples[-1].time_s if timeline.samples else 0.0
    return DemoSummary(
        completed=summary.finished and summary.steps >= scenario.steps,
        state=summary.state.value,
        reason=summary.reason,
        steps=summary.steps,
        total_steps=scenario.steps,
        first_loss=summary.first_loss,
        last_loss=summary.last_loss,
        emulated=summary.emulated,
        emulation=emulation_text(scenario),
        profiles=[
            {
                "device_type": p.device_type,
                "from_cache": p.from_cache,
                "emulated": p.emulated,
                "slowdown_factor": p.slowdown_factor,
            }
            for p in profiled
        ],
        plans=_plan_views(timeline),
        crash=crash,
        join=join,
        throughput_samples_per_s=_throughput(timeline, crash, join, end_s),
        failure_count=summary.failure_count,
        lost_steps_total=summary.lost_steps_total,
        checkpoint_path=summary.checkpoint_path,
        workdir=str(workdir),
        ray_temp_dir=ray_temp_dir,
        events=[event_to_json(e) for e in summary.events],
    )

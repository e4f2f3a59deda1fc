"""The demo's summary: plans before and after each change, loss, throughput, recovery, emulation.

:func:`build_summary` reads the controller's summary (its events carry every decision with its
numbers) and the driver's :class:`~orchestrator.demo.timeline.Timeline` (when the demo crashed and
added nodes, and the committed step count over time). Pure: no Ray.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.demo.scenario import DemoScenario
from orchestrator.demo.timeline import Timeline


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


def _after(
    events: list[dict[str, Any]], time_s: float, kinds: tuple[str, ...]
) -> list[dict[str, Any]]:
    return [e for e in events if e.get("kind") in kinds and float(e.get("time_s", 0)) >= time_s]


def _crash(timeline: Timeline, events: list[dict[str, Any]]) -> dict[str, Any] | None:
    if timeline.crashed_at_s is None:
        return None
    recovered = [
        e
        for e in _after(events, timeline.crashed_at_s, ("recovery",))
        if "recovery_s" in e.get("data", {})
    ]
    info: dict[str, Any] = {
        "node": timeline.crashed_node,
        "after_step": timeline.crashed_at_step,
        "recovered": bool(recovered),
    }
    if recovered:
        data = recovered[0]["data"]
        info["crash_to_first_step_s"] = float(recovered[0]["time_s"]) - timeline.crashed_at_s
        info["detected_to_first_step_s"] = float(data["recovery_s"])
        info["lost_steps"] = int(data["lost_steps"])
        info["first_step_after"] = int(data["step"])
    restores = [
        e["message"]
        for e in _after(events, timeline.crashed_at_s, ("recovery",))
        if "recovery_s" not in e.get("data", {})
    ]
    info["restored"] = restores[:2]
    return info


def _join(timeline: Timeline, events: list[dict[str, Any]]) -> dict[str, Any] | None:
    if timeline.joined_at_s is None:
        return None
    decisions = [
        e
        for e in _after(events, timeline.joined_at_s, ("replan", "replan_skipped"))
        if e.get("data", {}).get("trigger") == "join"
    ]
    info: dict[str, Any] = {
        "node": timeline.joined_node,
        "at_step": timeline.joined_at_step,
        "decision": decisions[0]["kind"] if decisions else "none seen",
        "reason": decisions[0]["message"] if decisions else "",
        "numbers": decisions[0].get("data", {}) if decisions else {},
        "switched": bool(decisions) and decisions[0]["kind"] == "replan",
    }
    if info["switched"]:
        measured = [
            e
            for e in _after(events, float(decisions[0]["time_s"]), ("plan_chosen",))
            if "switch_cost_s" in e.get("data", {})
        ]
        if measured:
            info["join_to_first_step_s"] = float(measured[0]["time_s"]) - timeline.joined_at_s
            info["switch_cost_s"] = float(measured[0]["data"]["switch_cost_s"])
    return info


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
    summary: dict[str, Any],
    timeline: Timeline,
    profiled: list[Any],
    workdir: Path,
    ray_temp_dir: str = "",
) -> DemoSummary:
    """The demo's summary from the controller's summary and the driver's timeline."""
    events = list(summary.get("events", []))
    crash = _crash(timeline, events)
    join = _join(timeline, events)
    end_s = timeline.samples[-1].time_s if timeline.samples else 0.0
    steps = int(summary.get("steps", 0))
    return DemoSummary(
        completed=summary.get("state") == "finished" and steps >= scenario.steps,
        state=str(summary.get("state", "")),
        reason=str(summary.get("reason", "")),
        steps=steps,
        total_steps=scenario.steps,
        first_loss=summary.get("first_loss"),
        last_loss=summary.get("last_loss"),
        emulated=bool(summary.get("emulated")),
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
        failure_count=int(summary.get("failure_count", 0)),
        lost_steps_total=int(summary.get("lost_steps_total", 0)),
        checkpoint_path=str(summary.get("checkpoint_path", "")),
        workdir=str(workdir),
        ray_temp_dir=ray_temp_dir,
        events=events,
    )

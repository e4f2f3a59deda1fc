"""The demo's summary as text for people (``--json`` prints :meth:`DemoSummary.to_json`)."""

from __future__ import annotations

from typing import Any

from orchestrator.demo.summary import DemoSummary, PlanView


def _num(value: Any, fmt: str = ".2f", unit: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:{fmt}}{unit}"


def _plan_lines(plan: PlanView, start_s: float) -> list[str]:
    devices = ", ".join(f"{t} x{n}" for t, n in sorted(plan.devices.items()))
    head = (
        f"  [{plan.reason}] at +{plan.time_s - start_s:.1f} s: {devices}; "
        f"predicted {plan.predicted_step_s:.3f} s/step"
    )
    return [head, *(f"      {r}" for r in plan.replicas)]


def render(summary: DemoSummary) -> list[str]:
    """The summary, one line per fact."""
    lines = ["", "=== orchestrator demo: summary ==="]
    verdict = "completed" if summary.completed else f"NOT completed ({summary.state})"
    lines.append(f"training: {verdict}, {summary.steps}/{summary.total_steps} steps")
    if summary.reason:
        lines.append(f"  reason: {summary.reason}")
    lines.append(
        f"loss: first {_num(summary.first_loss, '.4f')} -> last {_num(summary.last_loss, '.4f')}"
        + (" (fell)" if summary.loss_fell else " (did not fall)")
    )
    start_s = summary.plans[0].time_s if summary.plans else 0.0
    lines.append("plans (before and after each change):")
    for plan in summary.plans:
        lines.extend(_plan_lines(plan, start_s))
    lines.extend(_uniform_lines(summary.uniform_data_parallel))
    lines.extend(_crash_lines(summary.crash))
    lines.extend(_join_lines(summary.join))
    tp = summary.throughput_samples_per_s
    lines.append(
        "throughput (samples/s, measured at the driver): "
        f"initial {_num(tp.get('initial'), '.1f')}, after the crash "
        f"{_num(tp.get('after_crash'), '.1f')}, after the join {_num(tp.get('after_join'), '.1f')}"
    )
    lines.append(
        f"failures: {summary.failure_count}; steps lost in total: {summary.lost_steps_total}"
    )
    profiled = ", ".join(_profile_text(p) for p in summary.profiles)
    lines.append(f"profiles: {profiled}")
    lines.append(summary.emulation)
    if summary.checkpoint_path:
        lines.append(f"final checkpoint: {summary.checkpoint_path}")
    lines.append(f"work directory (job, profiles, logs): {summary.workdir}")
    return lines


def _profile_text(p: dict[str, Any]) -> str:
    how = "cached" if p["from_cache"] else "measured"
    slower = f", x{p['slowdown_factor']:g} slower" if p["emulated"] else ""
    return f"{p['device_type']} ({how}{slower})"


def _crash_lines(crash: dict[str, Any] | None) -> list[str]:
    if crash is None:
        return ["crash: none (--no-failure)"]
    head = f"crash: node {crash['node'][:8]} killed after step {crash['after_step']}"
    if not crash.get("recovered"):
        return [head, "  no recovery was seen"]
    return [
        head,
        f"  recovery: first step {_num(crash.get('crash_to_first_step_s'), '.1f', ' s')} after "
        f"the crash ({_num(crash.get('detected_to_first_step_s'), '.1f', ' s')} after it was "
        f"detected); lost steps: {crash.get('lost_steps')}",
        *(f"  {m}" for m in crash.get("restored", [])),
    ]


def _join_lines(join: dict[str, Any] | None) -> list[str]:
    if join is None:
        return ["join: none"]
    lines = [f"join: node {join['node'][:8]} joined at step {join['at_step']}"]
    if join.get("switched"):
        lines.append(
            f"  switched: first step of the new plan "
            f"{_num(join.get('join_to_first_step_s'), '.1f', ' s')} after the join "
            f"(switch cost {_num(join.get('switch_cost_s'), '.1f', ' s')})"
        )
    else:
        lines.append(f"  kept the plan: {join.get('decision')}")
    if join.get("reason"):
        lines.append(f"  decision: {join['reason']}")
    return lines


def _uniform_lines(uniform: dict[str, Any] | None) -> list[str]:
    """The initial plan against uniform data parallel on the same nodes (both predicted)."""
    if not uniform:
        return []
    if uniform.get("uniform_predicted_step_s") is None:
        return [f"  uniform data parallel: not possible ({uniform.get('note', '')})"]
    shares = uniform.get("uniform_batch_per_worker") or []
    share = "/".join(str(s) for s in sorted(set(shares)))
    return [
        f"  uniform data parallel on the starting nodes ({len(shares)} workers, batch {share} "
        f"each, as Ray Train runs): predicted {uniform['uniform_predicted_step_s']:.3f} s/step, "
        f"{_num(uniform.get('uniform_over_plan'), '.2f', 'x')} the initial plan's (emulated)"
    ]

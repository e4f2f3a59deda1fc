"""Goodput under repeated node failures: our elastic controller against Ray Train v2 elastic
training, on the same local cluster and the same failure schedule.

Each system gets a fresh local Ray cluster of ``--nodes`` one-CPU nodes of one device type
(``A100-80``), a head holding no work, and the project's fast health checks (a crashed node is
declared dead in ~1.4 s); the model, data, global batch, optimizer and checkpoint interval of
bench/recovery.py. Once ``--warmup-steps`` steps are committed, the schedule starts:

- a reference window of ``--reference-s`` seconds without failures;
- then ``--kills`` periods of ``--period-s`` seconds: at the start of each, every process of one
  node hosting a worker is SIGKILLed (the oldest such node), and ``--replace-after-s`` later a new
  node of the same type joins.

Goodput = committed samples per second over the failure periods / the same over the reference
window of the same run (committed: the committed step count at the end of a window less the
count at its start, so steps trained again after a restart count once). Also: the steps lost
(trained again), the longest time without a new committed step after each kill, and the wall
time. Target: ours >= 0.9.

The nodes run at an emulated speed of ``--emulated-speed`` (default 0.25) of the host CPU, on
both systems: every rank's forward, backward and update last 4x their CPU time, the rest spent
asleep (``orchestrator/worker/emulation.py``; Ray Train's ranks through the same ``Stretcher``,
bench/_raytrain_recovery.py). Why: each emulated node should behave like a machine of its own. At
speed 1.0 three ranks fill the host's two cores, so a replacement's boot (its raylet, its actor's
process, ``import torch``) takes CPU from the ranks training meanwhile and is itself slowed by
them, which no new machine on a real cluster does; stretched, the ranks leave the cores room.
``--emulated-speed 1.0`` runs the earlier set-up. Ours may run a rank's whole share of the batch
as one microbatch (sizes 8 and 12: 24 on three and on two ranks), as each Ray Train worker does.

Ours: the elastic controller actor (``orchestrator.runtime.elastic``) planning from profiles
measured on the cluster. Our replacement nodes boot at nice 19 until an actor there starts to
train, labelled in the output: an emulation of a new machine booting on its own CPU, as it would
on a real cluster, where here it shares the two cores with the training ranks
(``runtime/local_nodes.py``; ``--boot-at-normal-priority`` turns it off). Ray Train's
replacements boot at normal priority (its workers have no hook to end the low-priority boot).

Ray Train: ``TorchTrainer`` with ``ScalingConfig(num_workers=(nodes - 1,
nodes))`` (elastic in Ray Train v2: ``RAY_TRAIN_V2_ENABLED=1``) and ``FailureConfig(max_failures=
--kills + 2)``, rank 0 checkpointing every ``--checkpoint-interval`` steps through
``ray.train.report`` (bench/_raytrain_recovery.py), run with ``RAY_TRAIN_WORKER_GROUP_START_
TIMEOUT_S=10`` (Ray Train's default of 60 s would leave it restarting through most periods;
``--raytrain-defaults`` runs it as shipped). Nothing passes or fails; the figures go to
docs/benchmarks.md.

Run: .venv/bin/python bench/goodput.py [--period-s 30] [--kills 3] [--ours-only]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _goodput_side import Schedule, figures, run_ours, run_raytrain
from _stall_causes import breakdown, intervals, step_slowdown
from recovery import GLOBAL_BATCH, KIND, job_spec, raytrain_config

from orchestrator.demo.cluster import ClusterStartError, LocalCluster, NodeKind
from orchestrator.demo.output import ray_output_to
from orchestrator.runtime.local_ray import child_pids, kill_started
from orchestrator.worker.emulation import SHARED_REFERENCES_ENV

LIMIT_S = 300.0  # to reach the warm-up steps
# The nodes' emulated speed relative to the host CPU (which runs at 1.0, unstretched). Below 1.0
# every rank's compute is stretched (it sleeps the rest of its emulated time), so three ranks leave
# the two host cores room for a replacement's boot, as a new machine boots on its own CPU.
EMULATED_SPEED = 0.25
MICROBATCH_SIZES = [8, 12]  # a rank's share of the global batch of 24 on three and on two nodes
REFERENCE_SPEED = 1.0  # orchestrator.runtime.discovery.emulated_reference_speed


def node_kind(args: argparse.Namespace) -> NodeKind:
    return NodeKind(KIND.device_type, args.emulated_speed, KIND.num_devices)


def log(text: str) -> None:
    print(text, file=sys.__stdout__, flush=True)


def _started(nodes: int, kind: NodeKind, attempts: int = 3) -> LocalCluster:
    """A started local cluster; on a busy host the head may time out starting: try again."""
    for attempt in range(1, attempts + 1):
        cluster = LocalCluster()
        try:
            cluster.start([kind] * nodes)
            return cluster
        except ClusterStartError as exc:
            if attempt == attempts:
                raise
            log(f"  cluster start failed ({exc}); trying again in 10 s")
            time.sleep(10)
    raise AssertionError("unreachable")


def ours(args: argparse.Namespace, schedule: Schedule, work: Path) -> dict[str, Any]:
    import ray

    from orchestrator.runtime.discovery import discover_nodes
    from orchestrator.runtime.jobs import worker_job
    from orchestrator.runtime.profiling import profile_device_types
    from orchestrator.spec.job import JobSpec

    spec = job_spec(args.checkpoint_interval)
    spec["name"] = "goodput-bench"
    spec["elasticity"] = {"max_failures": 4 * args.kills}  # never the limit here
    # Ray Train's workers each run their whole share of the batch in one pass (8 of 24 on three
    # workers, 12 on two); ours may too: with only 8, two ranks would each run 8 + 4.
    spec["training"]["microbatch_sizes"] = MICROBATCH_SIZES
    work.mkdir(parents=True, exist_ok=True)
    job_file = work / "job.yaml"
    job_file.write_text(json.dumps(spec))
    cluster = _started(args.nodes, node_kind(args))
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        profile_device_types(
            worker_job(JobSpec.model_validate(spec), job_file), discover_nodes(), MICROBATCH_SIZES,
            work / "profiles", work / "profile-cache", out=lambda s: None,
        )  # fmt: skip
        timeline, summary = run_ours(
            cluster, job_file, schedule, warmup_steps=args.warmup_steps, limit_s=LIMIT_S, log=log,
            low_priority_boot=not args.boot_at_normal_priority,
        )  # fmt: skip
        out = figures(timeline, schedule, GLOBAL_BATCH)
        out["recoveries"] = [
            (round(float(r["recovery_s"]), 2), r["lost_steps"]) for r in summary["recoveries"]
        ]
        out["switch_costs_s"] = [round(float(s), 2) for s in summary["switch_costs_s"]]
        # The controller's own count: a restore from the checkpoint whose run then committed
        # nothing more in the window leaves no trace in the committed-step rows.
        out["steps_lost_by_controller"] = summary["lost_steps_total"]
        kinds = {"failure", "recovery", "plan_chosen", "replan", "replan_skipped", "node_joined",
                 "warming", "warm_ready"}  # fmt: skip
        ref_end = timeline.started_s + schedule.reference_s
        spans = intervals(summary["events"], timeline.kills_s)
        step_s = out["step_s_reference"]
        out["lost_by_cause_s"] = breakdown(
            timeline.rows, spans, ref_end, timeline.started_s + schedule.total_s, step_s
        )
        out["lost_in_reference_s"] = sum(
            breakdown(timeline.rows, spans, timeline.started_s, ref_end, step_s).values()
        )
        out["warm_up_step_slowdown"] = step_slowdown(timeline.rows, spans, "warm-up", step_s)
        out["checkpoints_s"] = _checkpoint_seconds(summary["events"], timeline.started_s, ref_end)
        # The same survivors' steps before the joiner warms (after the recovery, before the
        # warm-up): what a warm-up's steps should be compared with, as they run on one node
        # fewer than the reference window's.
        out["survivors_alone_step_slowdown"] = step_slowdown(
            timeline.rows, _alone_spans(spans), "alone", step_s
        )
        # For --json: the committed-step rows and the controller's events, in full.
        out["rows"] = [(round(t - timeline.started_s, 3), d) for t, d in timeline.rows]
        out["step_timings"] = [
            (round(t - timeline.started_s, 3), round(d, 4), c)
            for t, d, c in summary["step_timings"]
        ]
        out["niced_threads"] = summary["niced_threads"]
        out["raw_events"] = [
            {**e, "time_s": e["time_s"] - timeline.started_s}
            for e in summary["events"]
            if e["time_s"] >= timeline.started_s
        ]
        out["joins_s"] = _joins(timeline, summary["events"])
        out["warm_ups"] = [
            {k: e["data"].get(k) for k in ("start_s", "import_s", "build_s", "total_s")}
            for e in summary["events"]
            if e["kind"] == "warm_ready" and e["time_s"] >= timeline.started_s
        ]
        out["events"] = [
            f"{e['time_s'] - timeline.started_s:7.1f} s {e['kind']}: {e['message'][:150]}"
            for e in summary["events"]
            if e["kind"] in kinds and e["time_s"] >= timeline.started_s
        ]
        return out
    finally:
        ray.shutdown()
        cluster.shutdown()


def _joins(timeline: Any, events: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Each replacement, in seconds after its start was asked: its raylet registered (the
    cluster's ``add`` returned), the controller saw it (``node_joined``), its joiner was warm,
    the switch onto it measured."""
    out = []
    for i, asked in enumerate(timeline.replace_asked_s):
        registered = timeline.replaced_s[i] if i < len(timeline.replaced_s) else float("nan")
        marks = {"registered": registered}
        after = asked
        for name, kind in (("seen", "node_joined"), ("warm", "warm_ready"),
                           ("switched", "plan_chosen")):  # fmt: skip
            e = next(
                (e for e in events if e["time_s"] >= after and e["kind"] == kind
                 and (kind != "plan_chosen" or "switch_cost_s" in e["data"])),
                None,
            )  # fmt: skip
            if e is None:
                break
            marks[name] = e["time_s"]
            after = e["time_s"]
        out.append({k: round(v - asked, 2) for k, v in marks.items()})
    return out


def _alone_spans(spans: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """From each recovery's first step to the next warm-up's start: the survivors train alone."""
    warms = sorted(s0 for s0, _, cause in spans if cause == "warm-up")
    out = []
    for _, end, cause in spans:
        if cause == "recovery":
            nxt = next((w for w in warms if w > end), None)
            if nxt is not None:
                out.append((end, nxt, "alone"))
    return out


def _checkpoint_seconds(
    events: list[dict[str, Any]], started_s: float, ref_end_s: float
) -> dict[str, tuple[int, float, float]]:
    """Checkpoints saved in the reference window and after it: (count, median s, max s)."""
    out: dict[str, tuple[int, float, float]] = {}
    for name, keep in (
        ("reference", lambda t: started_s <= t < ref_end_s),
        ("failures", lambda t: t >= ref_end_s),
    ):
        took = sorted(
            float(e["data"]["duration_s"])
            for e in events
            if e["kind"] == "checkpoint" and "duration_s" in e["data"] and keep(e["time_s"])
        )
        if took:
            out[name] = (len(took), round(took[len(took) // 2], 3), round(took[-1], 3))
    return out


def raytrain(args: argparse.Namespace, schedule: Schedule, work: Path) -> dict[str, Any]:
    import ray

    env = {} if args.raytrain_defaults else {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10"}
    cluster = _started(args.nodes, node_kind(args))
    try:
        ray.init(address=cluster.address, log_to_driver=False)  # to see which nodes host workers
        timeline = run_raytrain(
            cluster, work, {**raytrain_config(), "fastest_speed": REFERENCE_SPEED}, schedule,
            checkpoint_interval=args.checkpoint_interval, min_workers=args.nodes - 1,
            max_workers=args.nodes, max_failures=args.kills + 2, extra_env=env,
            warmup_steps=args.warmup_steps, limit_s=LIMIT_S, log=log,
        )  # fmt: skip
        return figures(timeline, schedule, GLOBAL_BATCH)
    finally:
        ray.shutdown()
        cluster.shutdown()


def _fmt(value: Any, spec: str = ".1f") -> str:
    if isinstance(value, int | float) and math.isfinite(value):
        return f"{value:{spec}}"
    return "n/a"


def report(results: dict[str, dict[str, Any]], schedule: Schedule) -> None:
    log("")
    log(
        f"schedule: reference {schedule.reference_s:.0f} s, then {schedule.kills} kills every "
        f"{schedule.period_s:.0f} s, each node replaced {schedule.replace_after_s:.0f} s later"
    )
    log(f"{'system':<28} {'goodput':>7} {'samples/s ref':>13} {'failures':>8} {'lost':>5} "
        f"{'steps ref/fail':>14} {'stall after each kill, s':>26}")  # fmt: skip
    for name, r in results.items():
        if "goodput" not in r:
            log(f"{name:<28} {r.get('error')}")
            continue
        stalls = " ".join(_fmt(s) for s in r["stalls_s"])
        log(
            f"{name:<28} {_fmt(r['goodput'], '.3f'):>7} "
            f"{_fmt(r['reference_samples_per_s']):>13} {_fmt(r['failures_samples_per_s']):>8} "
            f"{_fmt(r['steps_lost'], '.0f'):>5} "
            f"{r['committed_steps_reference']:>6}/{r['committed_steps_failures']:<7} "
            f"{stalls:>26}"
        )
        log(
            f"  {name}: {_fmt(r['stalled_s'])} s of {schedule.kills * schedule.period_s:.0f} s "
            f"stalled (gaps over 3 reference steps of {_fmt(r['step_s_reference'], '.3f')} s); "
            f"{_fmt(r['samples_per_s_between_stalls'])} samples/s between stalls"
        )
        if "error" in r:
            log(f"  {name}: {r['error']}")
        if r.get("recoveries"):
            log(f"  {name}: recoveries (s from failure seen to first step, lost): "
                f"{r['recoveries']}")  # fmt: skip
        for line in r.get("events", []):
            log(f"    {line}")
        if r.get("lost_by_cause_s"):
            causes = r["lost_by_cause_s"]
            lost = sum(causes.values())
            log(f"  {name}: time lost under failures by cause, s (total {lost:.1f}; the "
                f"reference window lost {r['lost_in_reference_s']:.1f} of "
                f"{schedule.reference_s:.0f} s the same way): "
                + ", ".join(f"{k} {v:.1f}" for k, v in causes.items()))  # fmt: skip
            ratio, n = r["warm_up_step_slowdown"]
            log(f"  {name}: median step while a joiner warms / reference step: "
                f"{_fmt(ratio, '.2f')} ({n} steps); warm-ups, s: {r['warm_ups']}")  # fmt: skip
        if r.get("joins_s"):
            log(f"  {name}: each replacement, s after its start: raylet registered, seen by the "
                f"controller, joiner warm, switched: {r['joins_s']}")  # fmt: skip
        if r.get("survivors_alone_step_slowdown"):
            ratio, n = r["survivors_alone_step_slowdown"]
            log(f"  {name}: median step of the survivors alone (after a recovery, before the "
                f"joiner warms) / reference step: {_fmt(ratio, '.2f')} ({n} steps)")  # fmt: skip
        if r.get("checkpoints_s"):
            log(f"  {name}: checkpoints saved (count, median s, max s): {r['checkpoints_s']}")
        if any(r.get("replacements_booted_niced", [])):
            log(f"  {name}: replacements booted at nice 19 until they trained (emulated: a new "
                f"machine boots on its own CPU): {r['replacements_booted_niced']}")  # fmt: skip
        elif "replacements_booted_niced" in r and name == "ours":
            log(f"  {name}: replacements booted at normal priority on the shared cores")
        if "steps_lost_by_controller" in r:
            log(f"  {name}: steps lost by the controller's count: {r['steps_lost_by_controller']}")
        if r.get("switch_costs_s"):
            log(f"  {name}: plan switches' measured cost, s (first launch, then each change): "
                f"{r['switch_costs_s']}")  # fmt: skip
    mine = results.get("ours", {}).get("goodput")
    if isinstance(mine, float) and math.isfinite(mine):
        log(f"goodput ours: {mine:.3f}  (target >= 0.9)")


def main() -> None:
    parser = argparse.ArgumentParser(description="goodput under repeated node kills")
    parser.add_argument("--nodes", type=int, default=3, help="one-CPU nodes at the start")
    parser.add_argument("--period-s", type=float, default=30.0, help="seconds between kills")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--reference-s", type=float, default=30.0, help="window without failures")
    parser.add_argument("--replace-after-s", type=float, default=2.0)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--checkpoint-interval", type=int, default=10)
    parser.add_argument("--ours-only", action="store_true")
    parser.add_argument("--raytrain-only", action="store_true")
    parser.add_argument(
        "--raytrain-defaults", action="store_true", help="Ray Train's 60 s group start timeout"
    )
    parser.add_argument(
        "--boot-at-normal-priority",
        action="store_true",
        help="our replacement nodes boot at normal priority on the shared cores (default: nice "
        "19 until they train, emulating a new machine booting on its own CPU)",
    )
    parser.add_argument(
        "--emulated-speed",
        type=float,
        default=EMULATED_SPEED,
        help="the nodes' emulated speed relative to the host CPU, both systems (1.0: unstretched, "
        "the ranks fill the host's cores)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not 0 < args.emulated_speed <= REFERENCE_SPEED:
        parser.exit(2, f"--emulated-speed is {args.emulated_speed}; pass a speed in (0, 1] (1.0: "
                       "the host CPU unstretched)\n")  # fmt: skip
    schedule = Schedule(args.reference_s, args.period_s, args.kills, args.replace_after_s)
    started = time.time()
    results: dict[str, dict[str, Any]] = {}
    sides = [] if args.raytrain_only else [("ours", ours)]
    if not args.ours_only:
        sides.append(("Ray Train v2" + (" (defaults)" if args.raytrain_defaults else ""), raytrain))
    with tempfile.TemporaryDirectory(prefix="goodput-bench-") as tmp:
        work = Path(tmp)
        with ray_output_to(work / "ray-driver.log"):
            for name, side in sides:
                log(f"{name}: {args.nodes} x {KIND.device_type} nodes (one CPU each, emulated "
                    f"speed {args.emulated_speed:g} of the host CPU)")  # fmt: skip
                before = child_pids()
                side_dir = work / name.split()[0].lower()
                # Each side's ranks share the emulated devices' reference CPU times on this
                # host (orchestrator/worker/emulation.py), new processes too; its own folder.
                os.environ[SHARED_REFERENCES_ENV] = str(side_dir / "emulation-references")
                try:
                    results[name] = side(args, schedule, side_dir)
                except Exception as exc:  # one side failing still reports the other
                    results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                finally:
                    kill_started(before)  # a node that failed to start may leave its processes
                report({name: results[name]}, schedule)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=2, default=str))
    report(results, schedule)
    log(
        f"(all on one machine, emulated nodes; {time.time() - started:.0f} s in all; load "
        f"average {os.getloadavg()[0]:.1f} at the end)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()

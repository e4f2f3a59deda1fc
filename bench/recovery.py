"""Recovery and join: our elastic controller against Ray Train v2 elastic training, in one run.

The same local Ray cluster for every system (a fresh one each, same settings): one head holding no
work and ``--nodes`` one-CPU nodes of one device type (``A100-80``, emulated speed 1.0, so no
compute is stretched), Ray's health checks shortened (a crashed node is declared dead in ~1.4 s).
The same model (the example GPT), data, global batch, optimizer and checkpoint interval.

Each system trains; after ``--crash-at`` committed steps the benchmark SIGKILLs every process of
one node that hosts a worker; once training has gone on for ``--steps-before-join`` steps after
the recovery, it starts a new node of the same type. Measured:

- crash -> first completed step after it (seconds), and the steps lost (committed before the
  crash but trained again after it);
- join -> first step at the larger size (seconds), and throughput before and after (samples/s,
  median over single steps).

Ours: ``orchestrator.runtime.elastic`` (the controller actor), planning from profiles measured on
this cluster. Ray Train: ``TorchTrainer`` with ``ScalingConfig(num_workers=(nodes - 1, nodes))``
and ``FailureConfig(max_failures=3)``, checkpoints through ``ray.train.report``, once with Ray
Train's defaults and once with ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=10``. Targets: crash ->
first step <= 2 s, join -> first step of the new plan <= 2 s, 0 steps lost when replicas hold the
state; the state each change of plan moved is printed (surviving actors keep theirs). Nothing
passes or fails; the figures go to docs/benchmarks.md.

Ours also splits the crash into its parts, from the controller's events (the kill until the
failure is seen, the restore chosen, the re-plan, the re-formation with its own parts, the first
step), and the join into its parts (the node starting, the probe seeing it, the switch
decision, the joiner's warm-up while training goes on, the switch itself) and, once the new plan
runs, posts a preemption notice for a worker's node during a step (as ``POST /v1/node-events``
does): the seconds from the notice to the evacuation decided and to the first step without it.

A third part, ours only (Ray Train has no notion of a slow worker): on a fresh cluster of the
same nodes, one worker's node is throttled ``--straggler-factor`` times slower mid-run (the
controller actor's ``emulate_slowdown``: emulated, standing in for thermal throttling), then
cooled down (``bench/_straggler_side.py``): time to detect, to the first step of the new plan,
throughput before / throttled / under the new plan (and the new plan's expected figure), and the
same for the plan that gives the node its work back.

Run: .venv/bin/python bench/recovery.py [--nodes 3] [--skip-tuned] [--ours-only]
     .venv/bin/python bench/recovery.py --straggler-only   (the straggler part alone)
     .venv/bin/python bench/recovery.py --join-only        (ours: join and drain, no crash)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ours_side import run_ours
from _raytrain_side import run_raytrain
from _straggler_side import run_straggler

from orchestrator.demo.cluster import LocalCluster, NodeKind
from orchestrator.demo.output import ray_output_to

KIND = NodeKind("A100-80", 1.0)
SHAPE = {
    "name": "gpt-recovery",
    "num_layers": 4,
    "hidden_size": 128,
    "num_heads": 4,
    "sequence_length": 64,
    "vocab_size": 256,
    "dtype": "fp32",
}
GLOBAL_BATCH = 24  # divisible by 2 and 3 workers
LEARNING_RATE = 3e-3
LIMIT_S = 240.0  # per wait; a system that takes longer is reported as such


def log(text: str) -> None:
    print(text, file=sys.__stdout__, flush=True)


def job_spec(checkpoint_interval: int) -> dict[str, Any]:
    return {
        "name": "recovery-bench",
        "model": {"factory": "orchestrator.models.gpt:make_gpt", "shape": SHAPE},
        "data": {},
        "training": {
            "global_batch_size": GLOBAL_BATCH,
            "microbatch_sizes": [8],
            "mixed_precision": False,
            "steps": 100_000,  # the benchmark stops the run once it has its figures
            "learning_rate": LEARNING_RATE,
            "optimizer": "adam",
        },
        "checkpoint": {
            "dir": "checkpoints",
            "interval_steps": checkpoint_interval,
            "resume": False,
        },
        "metrics": {"port": None},
        "profiles": "profiles",
        "elasticity": {"max_failures": 3},
    }


def raytrain_config() -> dict[str, Any]:
    return {
        "model_factory": "orchestrator.models.gpt:make_gpt",
        "model_kwargs": SHAPE,
        "sequence_length": SHAPE["sequence_length"],
        "seed": 0,
        "learning_rate": LEARNING_RATE,
        "global_batch_size": GLOBAL_BATCH,
        "steps": 100_000,
        "fastest_speed": KIND.emulated_speed,
    }


def _profiled_cluster(args: argparse.Namespace, work: Path) -> tuple[LocalCluster, Path]:
    """A fresh cluster of ``--nodes`` nodes, this process connected, the job's profiles measured
    on it; the job file."""
    import ray

    from orchestrator.runtime.discovery import discover_nodes
    from orchestrator.runtime.jobs import worker_job
    from orchestrator.runtime.profiling import profile_device_types
    from orchestrator.spec.job import JobSpec

    work.mkdir(parents=True, exist_ok=True)
    job_file = work / "job.yaml"
    job_file.write_text(json.dumps(job_spec(args.checkpoint_interval)))
    job = JobSpec.model_validate(job_spec(args.checkpoint_interval))
    cluster = LocalCluster()
    cluster.start([KIND] * args.nodes)
    ray.init(address=cluster.address, log_to_driver=False)
    profile_device_types(
        worker_job(job, job_file), discover_nodes(), [8], work / "profiles",
        work / "profile-cache", out=lambda s: None,
    )  # fmt: skip
    return cluster, job_file


def straggler(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import ray

    cluster: LocalCluster | None = None
    try:
        cluster, job_file = _profiled_cluster(args, work)
        return run_straggler(
            job_file, factor=args.straggler_factor, steady_steps=12,
            global_batch=GLOBAL_BATCH, limit_s=LIMIT_S, log=log,
        )  # fmt: skip
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def ours(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import ray

    cluster: LocalCluster | None = None
    try:
        cluster, job_file = _profiled_cluster(args, work)
        return run_ours(
            cluster, job_file, crash_at_step=None if args.join_only else args.crash_at,
            steps_before_join=args.steps_before_join, join_kind=KIND, limit_s=LIMIT_S, log=log,
        )  # fmt: skip
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def raytrain(args: argparse.Namespace, work: Path, env: dict[str, str]) -> dict[str, Any]:
    cluster = LocalCluster()
    try:
        cluster.start([KIND] * args.nodes)
        return run_raytrain(
            cluster, work, raytrain_config(), checkpoint_interval=args.checkpoint_interval,
            min_workers=args.nodes - 1, max_workers=args.nodes, crash_at_step=args.crash_at,
            steps_before_join=args.steps_before_join, join_kind=KIND, extra_env=env,
            limit_s=LIMIT_S, log=log,
        )  # fmt: skip
    finally:
        cluster.shutdown()


def _fmt(value: Any, spec: str = ".1f") -> str:
    if isinstance(value, int | float) and math.isfinite(value):
        return f"{value:{spec}}"
    return "n/a"


def report(results: dict[str, dict[str, Any]]) -> None:
    log("")
    log(f"{'system':<34} {'crash->step s':>13} {'lost':>5} {'join->step s':>12} "
        f"{'join lost':>9} {'samples/s before':>16} {'after':>7}")  # fmt: skip
    for name, r in results.items():
        log(
            f"{name:<34} {_fmt(r.get('recovery_s')):>13} {_fmt(r.get('lost_steps'), '.0f'):>5} "
            f"{_fmt(r.get('join_to_step_s')):>12} {_fmt(r.get('join_lost_steps'), '.0f'):>9} "
            f"{_fmt(r.get('samples_per_s_before')):>16} {_fmt(r.get('samples_per_s_after')):>7}"
        )
        for key in ("error", "join_note", "recovery_moved", "join_moved"):
            if key in r:
                log(f"  {name}: {r[key]}")
    mine = results["ours"].get("recovery_s")
    for name, r in results.items():
        theirs = r.get("recovery_s")
        if name != "ours" and mine and theirs:
            log(f"recovery time ours / {name}: {mine / theirs:.2f}  (target <= 0.33)")
    if mine:
        log(f"recovery time ours: {mine:.1f} s  (target <= 2 s)")
    join = results["ours"].get("join_to_step_s")
    if join:
        log(f"join -> first step of the new plan, ours: {join:.1f} s from starting the node")
    report_recovery(results["ours"])
    report_join(results["ours"])


def report_recovery(r: dict[str, Any]) -> None:
    """Where the crash's time went (ours), from the controller's events."""
    parts = r.get("recovery_parts")
    if not parts:
        return
    reform = parts.get("reform") or {}
    log("crash, by part (ours):")
    log(f"  kill -> failure seen                 {_fmt(parts.get('detect_s'), '.2f')} s")
    log(f"  failure -> restore chosen            {_fmt(parts.get('restore_chosen_s'), '.2f')} s")
    log(f"  restore chosen -> plan chosen        {_fmt(parts.get('replan_s'), '.2f')} s")
    log(
        f"  plan chosen -> re-formed (launched)  {_fmt(parts.get('reform_s'), '.2f')} s "
        f"(survivors {_fmt(reform.get('survivors_s'), '.2f')}, dropped "
        f"{_fmt(reform.get('drop_s'), '.2f')}, "
        f"place/start {_fmt(reform.get('place_and_start_s'), '.2f')}, exports "
        f"{_fmt(reform.get('exports_s'), '.2f')}, rendezvous and load "
        f"{_fmt(reform.get('join_s'), '.2f')} [engine {_fmt(reform.get('build_s'), '.2f')}, "
        f"layers in {_fmt(reform.get('load_s'), '.2f')}, process group "
        f"{_fmt(reform.get('rendezvous_s'), '.2f')}])"
    )
    log(f"  launched -> first step done          {_fmt(parts.get('first_step_s'), '.2f')} s")
    for t, kind, message in parts.get("events", []):
        log(f"    +{t:6.3f} s {kind}: {message}")


def report_join(r: dict[str, Any]) -> None:
    """Where the join's time went, and the drain's reaction (ours)."""
    parts = r.get("join_parts")
    if parts:
        warm = parts.get("warm_parts") or {}
        reform = parts.get("reform") or {}
        log("join, by part (ours):")
        log(
            f"  node start -> seen by the controller {_fmt(parts.get('start_to_seen_s'), '.2f')} s"
            f" (add() returned after {_fmt(parts.get('node_start_s'), '.2f')} s)"
        )
        log(f"  seen -> switch decided              {_fmt(parts.get('decide_s'), '.2f')} s"
            f"  ({parts.get('switch_rule', '')})")  # fmt: skip
        log(
            f"  joiner warm-up, training goes on    {_fmt(parts.get('warm_s'), '.2f')} s "
            f"(actor start {_fmt(warm.get('start_s'), '.2f')}, import torch "
            f"{_fmt(warm.get('import_s'), '.2f')}, engine built {_fmt(warm.get('build_s'), '.2f')}"
            f"; {parts.get('steps_while_warming', 'n/a')} steps trained meanwhile)"
        )
        log(
            "  switch: warm -> launched            "
            f"{_fmt(parts.get('switch_to_launched_s'), '.2f')} s (re-formation: place/start "
            f"{_fmt(reform.get('place_and_start_s'), '.2f')}, "
            f"exports {_fmt(reform.get('exports_s'), '.2f')}, rendezvous and load "
            f"{_fmt(reform.get('join_s'), '.2f')} [engine {_fmt(reform.get('build_s'), '.2f')}, "
            f"layers in {_fmt(reform.get('load_s'), '.2f')}, process group "
            f"{_fmt(reform.get('rendezvous_s'), '.2f')}]; actors started at the switch: "
            f"{parts.get('actors_started_at_switch')}, pre-warmed: {parts.get('actors_warm')})"
        )
        log(f"  first step of the new plan          {_fmt(parts.get('first_step_s'), '.2f')} s")
        log(
            f"switch (training paused) -> first step of the new plan: "
            f"{_fmt(parts.get('switch_to_step_s'), '.2f')} s  (target <= 2 s); node seen -> "
            f"first step {_fmt(parts.get('seen_to_step_s'), '.2f')} s"
        )
    if "drain_to_action_s" in r:
        log(
            f"drain (posted preemption notice) -> evacuation decided: "
            f"{_fmt(r['drain_to_action_s'], '.3f')} s (steps of "
            f"{_fmt(r.get('step_s_at_drain'), '.3f')} s; the step in flight finishes first); "
            "-> first step without the node "
            f"{_fmt(r.get('drain_to_step_s'), '.2f')} s; {r.get('drain_moved', '')}"
        )
    elif "drain_note" in r:
        log(f"drain: {r['drain_note']}")


def report_straggler(r: dict[str, Any]) -> None:
    log("")
    if "error" in r:
        log(f"straggler (ours): {r['error']} {r.get('events', '')}")
        return
    log(
        f"straggler (ours, emulated x{r['factor']:g} throttle): detected in "
        f"{_fmt(r['detect_s'])} s (measured {_fmt(r['measured_slowdown'], '.2f')}x), first step "
        f"of the new plan {_fmt(r['throttle_to_new_plan_s'])} s after the throttle"
    )
    log(
        f"  samples/s before {_fmt(r['samples_per_s_before'])}, throttled "
        f"{_fmt(r['samples_per_s_throttled'])}, new plan {_fmt(r['samples_per_s_new_plan'])} "
        f"(expected {_fmt(r['samples_per_s_expected'])}); switch rule: {r['switch_rule']}"
    )
    log(
        f"  cooled down: speed-up seen in {_fmt(r.get('cool_detect_s'))} s, work given back "
        f"(first step) {_fmt(r.get('cool_to_new_plan_s'))} s after, samples/s "
        f"{_fmt(r.get('samples_per_s_given_back'))}; the node's samples per step "
        f"{r['node_samples']}"
    )
    if "readmit_after_drop_s" in r:
        log(
            f"  left without work: tried again {_fmt(r['readmit_after_drop_s'])} s after "
            "the re-plan"
        )
        for line in r["readmit_events"]:
            log(f"    readmit: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description="crash and join: ours against Ray Train v2")
    parser.add_argument("--nodes", type=int, default=3, help="one-CPU nodes at the start")
    parser.add_argument("--crash-at", type=int, default=35, help="crash after this many steps")
    parser.add_argument("--steps-before-join", type=int, default=20)
    parser.add_argument("--checkpoint-interval", type=int, default=10)
    parser.add_argument("--skip-tuned", action="store_true", help="Ray Train defaults only")
    parser.add_argument(
        "--ours-only", action="store_true", help="skip Ray Train (its figures are recorded)"
    )
    parser.add_argument("--straggler-factor", type=float, default=3.0)
    parser.add_argument("--skip-straggler", action="store_true", help="crash and join only")
    parser.add_argument(
        "--straggler-only", action="store_true", help="only the throttled-node part (ours)"
    )
    parser.add_argument(
        "--join-only",
        action="store_true",
        help="ours only, no crash and no straggler part: the join's parts and a posted drain",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.join_only:
        args.ours_only = args.skip_straggler = True
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="recovery-bench-") as tmp:
        work = Path(tmp)
        results: dict[str, dict[str, Any]] = {}
        # Ray's driver messages (a crashed raylet's last lines) go to a log, not the figures.
        with ray_output_to(work / "ray-driver.log"):
            if not args.skip_straggler:
                log(f"straggler: {args.nodes} x {KIND.device_type} nodes (one CPU each)")
                results["straggler"] = straggler(args, work / "straggler")
            if args.straggler_only:
                report_straggler(results["straggler"])
                if args.json:
                    args.json.write_text(json.dumps(results, indent=2, default=str))
                return
            log(f"ours: {args.nodes} x {KIND.device_type} nodes (one CPU each)")
            results["ours"] = ours(args, work / "ours")
            if not args.ours_only:
                log("Ray Train v2, defaults")
                results["Ray Train v2 (defaults)"] = raytrain(args, work / "rt-default", {})
            if not (args.skip_tuned or args.ours_only):
                log("Ray Train v2, RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=10")
                results["Ray Train v2 (start timeout 10 s)"] = raytrain(
                    args, work / "rt-tuned", {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10"}
                )
    if args.json:  # first: the figures survive a report that fails
        args.json.write_text(json.dumps(results, indent=2, default=str))
    straggled = results.pop("straggler", None)
    report(results)
    if straggled is not None:
        report_straggler(straggled)
    log(f"(all on one machine, emulated nodes; {time.time() - started:.0f} s in all)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()

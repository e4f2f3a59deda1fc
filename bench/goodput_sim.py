"""Goodput at scale by simulation: the real controller, planner and cost model on a failure trace.

For each cluster size (mixed H100 / A100-80 nodes of 8 GPUs) and each failure rate (Meta's Llama 3
rate, 419 unexpected interruptions in 54 days on 16,384 GPUs, and ``--harsh`` times it), the real
elastic controller is stepped through a Poisson trace of node interruptions on simulated time
(orchestrator/sim), each interrupted node replaced by a new one after ``--replace-min``
minutes. The planner is the real one (its wall time is charged to the simulated clock); steps take
the cost model's predicted step time; recovery costs come from figures measured on the local
cluster, scaled by the model in orchestrator/sim/costs.py. Printed per scenario:

- goodput: committed samples per second over the same run without failures, for our controller
  with state moved as the runtime does now (survivors kept and re-formed in ``--reform-s``, 1.35 s
  measured; only layers new to a node move, actor to actor; holders write the checkpoints and
  read their own layers back for a restore, ``--restore-via-controller`` for the model before), for
  the runtime as it was before, as a labelled comparison (every layer through the controller, a
  new group started from scratch), and for checkpoint-restart (Ray Train v2's measured restart
  and lost work, restart.py);
- failures seen, median recovery seconds (failure -> first committed step), steps lost;
- the planner's re-plan wall time at that size (median and max over its real calls).

Every assumption is listed in docs/benchmarks.md ("Goodput at scale by simulation"). Nothing
passes or fails.

Run: .venv/bin/python bench/goodput_sim.py [--sizes 1024,16384] [--harsh 10] [--min-failures 20]
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import replace

from orchestrator.control.planning import MakePlanPlanner
from orchestrator.sim.costs import MEASURED_REFORM_S, CostModel, RestoreRead, StateMove
from orchestrator.sim.planner import PlanCache, TimedPlanner
from orchestrator.sim.restart import RestartModel, simulate_restart
from orchestrator.sim.run import Outcome, Scenario, goodput, simulate
from orchestrator.sim.trace import (
    SECONDS_PER_DAY,
    empty_trace,
    llama3_rate_per_gpu_s,
    poisson_trace,
)
from orchestrator.spec import ModelSpec, TrainingSpec
from orchestrator.spec.snapshot import NodeInfo

TYPES = ("H100", "A100-80")
GPUS_PER_NODE = 8
# The planner-speed benchmark's model: a GPT-3 13B-like shape, 96 blocks, 98 planner layers.
MODEL = ModelSpec(
    name="gpt-96L",
    num_layers=96,
    hidden_size=5120,
    num_heads=40,
    sequence_length=2048,
    vocab_size=50257,
    dtype="bf16",
)


def nodes_of(num_gpus: int) -> tuple[NodeInfo, ...]:
    per_type = max(1, num_gpus // (GPUS_PER_NODE * len(TYPES)))
    return tuple(
        NodeInfo(f"{t.lower()}-{i:05d}", t, GPUS_PER_NODE) for t in TYPES for i in range(per_type)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1024,16384")
    parser.add_argument("--harsh", type=float, default=10.0, help="factor of the harsher rate")
    parser.add_argument("--min-failures", type=float, default=20.0, help="expected per trace")
    parser.add_argument("--min-days", type=float, default=1.0, help="shortest trace")
    parser.add_argument("--reference-days", type=float, default=0.25, help="run without failures")
    parser.add_argument("--replace-min", type=float, default=15.0)
    parser.add_argument("--checkpoint-min", type=float, default=15.0)
    parser.add_argument("--reform-s", type=float, default=MEASURED_REFORM_S)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--restore-via-controller",
        action="store_true",
        help="ours restores a checkpoint through the controller (the runtime before its "
        "ranks read their own files; a labelled comparison)",
    )
    args = parser.parse_args()
    restore_read = RestoreRead.CONTROLLER if args.restore_via_controller else RestoreRead.HOLDERS
    print(f"ours: checkpoint restores read by the {restore_read.value}")

    print(
        f"{'GPUs':>6} {'rate':>6} {'days':>5} {'fail':>5} {'ours':>11} "
        f"{'old:via-ctrl':>12} {'ckpt-restart':>13} {'recovery s (ours/old/restart)':>32} "
        f"{'lost steps (ours/restart)':>26} {'re-plan s med/max':>18}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        nodes = nodes_of(size)
        gpus = sum(n.num_devices for n in nodes)
        training = TrainingSpec(
            global_batch_size=max(256, gpus // 2), microbatch_sizes=[1, 2, 4, 8]
        )
        planner = MakePlanPlanner(MODEL, training)
        ours = CostModel.for_model(
            MODEL, training, reform_s=args.reform_s, restore_read=restore_read
        )
        old = CostModel.for_model(MODEL, training, move=StateMove.THROUGH_CONTROLLER)
        cache: PlanCache = {}  # plans per cluster shape, shared by every run here
        first = TimedPlanner(planner, lambda _s: None, cache=cache)(_snapshot(nodes), {})
        step_s = first.predicted_step_s
        interval = max(1, round(args.checkpoint_min * 60 / step_s))
        for label, harsh in (("llama3", 1.0), (f"x{args.harsh:g}", args.harsh)):
            rate = llama3_rate_per_gpu_s(harsh) * gpus
            horizon_s = max(args.min_days * SECONDS_PER_DAY, args.min_failures / rate)
            trace = poisson_trace(rate, horizon_s, seed=args.seed)
            reference_trace = empty_trace(min(horizon_s, args.reference_days * SECONDS_PER_DAY))
            results: dict[str, tuple[Outcome, float]] = {}
            for name, costs in (("ours", ours), ("old", old)):
                scenario = Scenario(
                    nodes, trace, costs, args.replace_min * 60, checkpoint_interval_steps=interval
                )
                run = simulate(scenario, planner, plan_cache=cache)
                ref = simulate(
                    Scenario(nodes, reference_trace, costs, checkpoint_interval_steps=interval),
                    planner,
                    plan_cache=cache,
                )
                results[name] = (run, goodput(run, ref))
            # Checkpoint-restart gets its best checkpoint interval, Young/Daly's sqrt(2 C M) for
            # checkpoint cost C and mean time M between restarts (an interruption and its
            # replacement's join each restart the group); its goodput is measured against the
            # same failure-free run as ours (a checkpoint every --checkpoint-min minutes). Its
            # checkpoint costs what ours does: written by the holders of the first plan.
            write_s = ours.checkpoint_write_s(ours.writer_bytes_by_node(first.plan))
            young_daly_s = math.sqrt(2 * write_s / (2 * rate))
            restart_model = RestartModel(
                step_s=step_s,
                checkpoint_interval_steps=max(
                    1, round(min(young_daly_s, 60 * args.checkpoint_min) / step_s)
                ),
                checkpoint_write_s=write_s,
                checkpoint_read_s=ours.checkpoint_read_s(),
                replace_after_s=args.replace_min * 60,
            )
            restart = simulate_restart(restart_model, trace)
            restart_ref = simulate_restart(
                replace(restart_model, checkpoint_interval_steps=interval), reference_trace
            )
            restart_goodput = (restart.committed_steps / restart.sim_s) / (
                restart_ref.committed_steps / restart_ref.sim_s
            )
            run_ours, g_ours = results["ours"]
            run_old, g_old = results["old"]
            planner_s = run_ours.planner_charged_s + run_old.planner_charged_s
            restart_s = restart_model.restart_s + restart_model.checkpoint_read_s
            print(
                f"{gpus:>6} {label:>6} {horizon_s / SECONDS_PER_DAY:>5.1f} "
                f"{len(trace.times_s):>5} {g_ours:>11.3f} {g_old:>12.3f} "
                f"{restart_goodput:>13.3f} "
                f"{_recovery(run_ours):>12} / {_recovery(run_old):>6} / "
                f"{restart_s:>7.1f} "
                f"{run_ours.lost_steps:>12} / {restart.lost_steps:>10} "
                f"{statistics.median(planner_s):>9.2f} / {max(planner_s):>5.2f}",
                flush=True,
            )
            _details(run_ours, run_old, step_s, interval)
            print(
                f"       checkpoint-restart: a checkpoint every "
                f"{restart_model.checkpoint_interval_steps} steps (Young/Daly), "
                f"{restart.restarts} restarts"
            )


def _recovery(run: Outcome) -> str:
    """Median failure -> first step seconds; 'none' when no recovery completed."""
    return f"{run.median_recovery_s:.1f}" if run.recovery_s else "none"


def _details(ours: Outcome, old: Outcome, step_s: float, interval: int) -> None:
    def launches(run: Outcome) -> str:
        if not run.moved_bytes:
            return "no launches"
        return (
            f"median launch {statistics.median(run.launch_s):.1f} s moving "
            f"{statistics.median(run.moved_bytes) / 1e9:.0f} GB"
        )

    restores = ours.checkpoint_launch_s
    from_checkpoint = (
        f"{len(restores)} restores from the checkpoint (median "
        f"{statistics.median(restores):.1f} s, {sum(restores):.0f} s in all)"
        if restores
        else "no restore from the checkpoint"
    )
    print(
        f"       step {step_s:.2f} s, checkpoint every {interval} steps; ours: "
        f"{ours.failures} failures, {ours.switches} switches, {launches(ours)}, "
        f"{from_checkpoint}, checkpoints "
        f"{ours.checkpoint_write_s:.0f} s in all; old: {launches(old)}, checkpoint writes "
        f"{old.checkpoint_write_s:.0f} s and reads through the controller {old.fetch_s:.0f} s; "
        f"simulated in {ours.wall_s + old.wall_s:.0f} s"
    )


def _snapshot(nodes: tuple[NodeInfo, ...]):  # type: ignore[no-untyped-def]
    from orchestrator.spec.snapshot import ClusterSnapshot

    return ClusterSnapshot.of(0, nodes)


if __name__ == "__main__":
    main()

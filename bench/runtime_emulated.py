"""Our runtime against Ray Train's TorchTrainer on emulated clusters (figures in one run).

Heterogeneous: fast (A100-80) and slow (T4) one-CPU Ray nodes with a 4x speed gap; by default
2 fast at emulated speed 0.25 + 4 slow at 0.0625 (``--nodes 2,2`` for two of each). The model is
profiled on both types with ``orchestrator profile``'s machinery (one actor per type, times
stretched by the emulated speed), the planner plans with those profiles, and then, on the same
nodes:

- our runtime runs the planner's plan;
- our runtime runs the planner's fastest-type-only plan;
- TorchTrainer runs uniform data parallel (equal batch per worker, slow workers stretched alike).

Homogeneous: 4 A100-80 nodes at the fast speed; our planned plan against TorchTrainer.

Ratios printed: throughput ours / TorchTrainer (target >= 1.5), ours / fastest-only (>= 1.2),
measured / predicted step time (within 15%), homogeneous step time ours / TorchTrainer (<= 1.05).
Everything here is emulated on CPUs. Nothing passes or fails; the figures go to
docs/benchmarks.md.

Run: .venv/bin/python bench/runtime_emulated.py [--steps 8] [--rounds 2] [--nodes 2,4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from emulated_cluster import emulated_cluster
from ray_train_baseline import run_torchtrainer

from orchestrator.planner import make_plan
from orchestrator.runtime.actor import WorkerJob
from orchestrator.runtime.discovery import cluster_from_nodes, discover_nodes
from orchestrator.runtime.group import WorkerGroup
from orchestrator.runtime.profiling import profile_device_types
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan
from orchestrator.spec.profiles import ProfileSet

SHAPE = ModelSpec(
    name="gpt-bench",
    num_layers=8,
    hidden_size=128,
    num_heads=4,
    sequence_length=64,
    vocab_size=256,
    dtype="fp32",
)
GLOBAL_BATCH = 240  # divisible by 6 workers (TorchTrainer) and every microbatch size
MICROBATCHES = [4, 8, 16]
# A 4x speed gap. Both types are stretched (speeds relative to the host CPU) so that six workers
# leave CPU time to spare on a small machine: 2 x 1/4 + 4 x 1/16 = 0.75 cores busy at most.
FAST, SLOW = ("A100-80", 0.25), ("T4", 0.0625)
NUM_FAST, NUM_SLOW = 2, 4
ONLY_OURS = False  # --only-ours: skip TorchTrainer (the cost model's accuracy alone)
REFERENCE_SPEED = 1.0  # the host CPU (orchestrator.runtime.discovery.emulated_reference_speed)


def configure(
    global_batch: int,
    blocks: int,
    fast_speed: float,
    slow_speed: float,
    num_fast: int,
    num_slow: int,
    microbatches: list[int],
) -> None:
    """Set the workload, the emulated speeds and the node counts (module globals used below)."""
    global GLOBAL_BATCH, SHAPE, FAST, SLOW, NUM_FAST, NUM_SLOW, MICROBATCHES
    GLOBAL_BATCH = global_batch
    MICROBATCHES = microbatches
    SHAPE = SHAPE.model_copy(update={"num_layers": blocks})
    FAST, SLOW = (FAST[0], fast_speed), (SLOW[0], slow_speed)
    NUM_FAST, NUM_SLOW = num_fast, num_slow


def bench_job() -> WorkerJob:
    return WorkerJob(
        model_factory="orchestrator.models.gpt:make_gpt",
        model_kwargs=SHAPE.model_dump(mode="json", exclude_none=True),
        data={"sequence_length": SHAPE.sequence_length},
        optimizer="adam",
        learning_rate=1e-3,
    )


def training() -> TrainingSpec:
    return TrainingSpec(
        global_batch_size=GLOBAL_BATCH,
        microbatch_sizes=MICROBATCHES,
        optimizer="adam",
        mixed_precision=False,
        max_tensor_parallel=1,
    )


def measure_ours(
    job: WorkerJob,
    plan: Plan,
    steps: int,
    warmup: int = 3,
    estimate: object = None,
    profiles: ProfileSet | None = None,
) -> float:
    """Mean step time of ``plan`` through the WorkerGroup, timed at the driver.

    With the cost model's ``estimate``, prints where the step goes per rank against it (and,
    with the ``profiles`` it came from, the runtime's fixed terms against what they measured),
    and each rank's counted memory against the cost model's.
    """
    group = WorkerGroup(job)
    try:
        group.launch(plan)
        for _ in range(warmup):
            group.step()
        started = time.perf_counter()
        busiest_s = 0.0
        reports = []
        for _ in range(steps):
            report = group.step()
            reports.append(report)
            busiest_s += max(t.compute_s for t in report.stage_timings)
        elapsed_s = time.perf_counter() - started
        if estimate is not None:
            print_breakdown(reports, estimate, elapsed_s / steps, plan, profiles)
        if estimate is not None:
            print_memory(reports[-1], estimate)
        # How much of the step the busiest rank spent computing (stretch included): the rest is
        # waiting, communication and orchestration.
        print(f"    busiest rank computes {busiest_s / elapsed_s:.0%} of the step")
        assert group.emulated, "the benchmark cluster is emulated; every worker must say so"
        return elapsed_s / steps
    finally:
        group.stop()


def print_breakdown(
    reports: list,
    estimate: object,
    driver_step_s: float,
    plan: Plan | None = None,
    profiles: ProfileSet | None = None,
) -> None:
    """Per rank: measured compute (stretched forward, backward, update) and step against the
    estimate's compute + update and step; then the driver's step over the slowest rank's.

    With ``profiles``: per rank, its time outside the stretched compute (rank step - compute:
    the fixed terms, waiting on peers, the all-reduce) against the measured fixed terms the
    estimate charged, and the driver's step beyond the slowest rank's against the measured
    round trip."""
    terms = {}
    if profiles is not None:
        for d in estimate.devices:  # type: ignore[attr-defined]
            terms[d.device_type] = profiles.runtime_constants(d.device_type, with_time_terms=True)
    compute: dict[tuple[int, int], list[float]] = {}
    step: dict[tuple[int, int], list[float]] = {}
    inside: dict[tuple[int, int], list[float]] = {}  # collectives inside the compute calls
    for report in reports:
        for t in report.stage_timings:
            compute.setdefault((t.replica, t.stage), []).append(t.compute_s)
            step.setdefault((t.replica, t.stage), []).append(t.step_s)
            inside.setdefault((t.replica, t.stage), []).append(t.collective_s)
    for d in estimate.devices:  # type: ignore[attr-defined]
        key = (d.replica, d.stage)
        if key not in compute:
            continue
        # The layer-by-layer sharded path's collectives run inside its compute calls: they are
        # compared with the estimate's synchronisation below, not with its compute.
        collectives = statistics.median(inside[key])
        measured = statistics.median(c - a for c, a in zip(compute[key], inside[key], strict=True))
        constants = terms.get(d.device_type)
        fixed_mb = (constants.microbatch_overhead_s or 0.0) if constants else 0.0
        micro = -(-plan.replicas[d.replica].batch_size // plan.microbatch_size) if plan else 0
        # The estimate's compute holds the per-microbatch term; the measured compute does not.
        predicted = d.compute_s - micro * fixed_mb + d.update_s
        print(
            f"    r{d.replica}s{d.stage} {d.device_type:<8} compute+update measured {measured:.4f}"
            f" predicted {predicted:.4f} ({measured / predicted:.3f});"
            f" rank step {statistics.median(step[key]):.4f}"
        )
        if collectives > 0:
            ratio = f" ({collectives / d.allreduce_s:.3f})" if d.allreduce_s > 0 else ""
            print(
                f"      collectives inside the compute calls measured {collectives:.4f} s"
                f" predicted {d.allreduce_s:.4f}{ratio}"
            )
        if constants is not None:
            outside = statistics.median(s - c for s, c in zip(step[key], compute[key], strict=True))
            per_step = constants.step_overhead_s or 0.0
            fixed = micro * fixed_mb + per_step
            print(
                f"      outside compute {outside:.4f} s; fixed terms charged {fixed:.4f} s"
                f" ({micro} x {fixed_mb * 1e3:.2f} ms + {per_step * 1e3:.1f} ms),"
                f" exposed all-reduce {d.allreduce_s * 1e3:.1f} ms"
            )
    slowest = statistics.median(max(t.step_s for t in r.stage_timings) for r in reports)
    print(f"    driver step {driver_step_s:.4f} s, slowest rank step {slowest:.4f} s")
    trips = [c.round_trip_s for c in terms.values() if c is not None and c.round_trip_s]
    if trips:
        print(
            f"    driver beyond the slowest rank {(driver_step_s - slowest) * 1e3:.1f} ms;"
            f" round trip charged {max(trips) * 1e3:.1f} ms"
        )


def print_memory(report: object, estimate: object) -> None:
    """Per rank: the memory it counted at its last counted step (weights, gradients, optimizer
    state, activations at their peak: ``worker/memory_account.py``) against the cost model's
    device memory less its framework footprint (sharded stages' slices included). The footprint
    is left out on both sides: on a CPU it is the process's resident memory, not a device's."""
    predicted = {(d.replica, d.stage): d for d in estimate.devices}  # type: ignore[attr-defined]
    ratios = []
    for t in report.stage_timings:  # type: ignore[attr-defined]
        d = predicted.get((t.replica, t.stage))
        if t.memory is None or d is None:
            continue
        want, got = d.memory_bytes - d.framework_bytes, t.memory.total_bytes
        ratios.append(want / got)
        print(
            f"    r{t.replica}s{t.stage} memory predicted {want / MIB:.2f} MiB,"
            f" counted {got / MIB:.2f} MiB ({want / got:.3f})"
        )
    if ratios:
        print(f"    predicted / counted memory per rank {min(ratios):.3f} .. {max(ratios):.3f}")


MIB = 1024 * 1024


def describe(plan: Plan) -> str:
    parts = []
    for r in plan.replicas:
        stages = "+".join(
            f"{s.device_type}[{s.layers[0]},{s.layers[1]})"
            + ("" if s.sharding.value == "none" else f"/{s.sharding.value}")
            for s in r.stages
        )
        parts.append(f"b{r.batch_size}:{stages}")
    return f"mb{plan.microbatch_size} " + " | ".join(parts)


def plan_with_profiles(job: WorkerJob, work: Path) -> tuple[object, ProfileSet]:
    nodes = discover_nodes()
    profiled = profile_device_types(
        job, nodes, MICROBATCHES, work / "profiles", work / "cache", out=lambda s: None
    )
    for p in profiled:
        print(f"  profile {p.device_type}: emulated={p.emulated} x{p.slowdown_factor:g}")
    profiles = ProfileSet.load([work / "profiles"]).for_model(SHAPE.name)
    for device_type in profiles.device_types():
        c = profiles.runtime_constants(device_type, with_time_terms=True)
        if c is not None:
            print(
                f"  runtime terms {device_type}: {(c.microbatch_overhead_s or 0) * 1e3:.2f} ms"
                f" per microbatch, {(c.step_overhead_s or 0) * 1e3:.1f} ms per step,"
                f" round trip {(c.round_trip_s or 0) * 1e3:.1f} ms, per call"
                f" {(c.call_forward_s or 0) * 1e3:.2f} ms forward +"
                f" {(c.call_backward_s or 0) * 1e3:.2f} ms backward,"
                f" p2p latency {(c.p2p_latency_s or 0) * 1e3:.2f} ms"
            )
    return make_plan(cluster_from_nodes(nodes), SHAPE, training(), profiles), profiles


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def rounds_of(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Run every system once per round, in turn, and keep each one's median step time.

    Taking turns spreads the load of a shared machine over all systems alike.
    """
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name, run in runs.items():
            times[name].append(run())
            print(
                f"  round {r + 1}: {name:<22} step {times[name][-1]:.4f} s (load {load_average()})"
            )
    return {name: statistics.median(values) for name, values in times.items()}


def heterogeneous(job: WorkerJob, steps: int, rounds: int, work: Path) -> dict[str, float]:
    print(
        f"heterogeneous (emulated): {NUM_FAST} x {FAST[0]} @{FAST[1]}"
        f" + {NUM_SLOW} x {SLOW[0]} @{SLOW[1]}"
    )
    with emulated_cluster([(FAST[0], FAST[1], NUM_FAST), (SLOW[0], SLOW[1], NUM_SLOW)]):
        result, profiles = plan_with_profiles(job, work)
        plan = result.plan  # type: ignore[attr-defined]
        baseline = result.baselines["fastest_type_only"]  # type: ignore[attr-defined]
        predicted_s = result.estimate.step_time_s  # type: ignore[attr-defined]
        print(f"  planned plan     {describe(plan)}  (predicted {predicted_s:.4f} s)")
        print(
            f"  fastest-only     {describe(baseline.plan)}"
            f"  (predicted {baseline.estimate.step_time_s:.4f} s)"
        )
        runs = {
            "ours, planned": lambda: measure_ours(
                job,
                plan,
                steps,
                estimate=result.estimate,  # type: ignore[attr-defined]
                profiles=profiles,
            ),
            "ours, fastest-only": lambda: measure_ours(
                job,
                baseline.plan,
                steps,
                estimate=baseline.estimate,
                profiles=profiles,
            ),
            "TorchTrainer, uniform": lambda: (
                run_torchtrainer(
                    job, GLOBAL_BATCH, NUM_FAST + NUM_SLOW, REFERENCE_SPEED, steps
                ).step_time_s
            ),
        }
        if ONLY_OURS:
            runs.pop("TorchTrainer, uniform")
        median = rounds_of(runs, rounds)
    for name, step_s in median.items():
        print(f"  median {name:<22} step {step_s:.4f} s  {GLOBAL_BATCH / step_s:8.1f} samples/s")
    ours_s = median["ours, planned"]
    print(f"  measured / predicted step time   {ours_s / predicted_s:.3f}  (planned)")
    print(
        "  measured / predicted step time   "
        f"{median['ours, fastest-only'] / baseline.estimate.step_time_s:.3f}  (fastest-only)"
    )
    if ONLY_OURS:
        return {"measured_over_predicted": ours_s / predicted_s}
    figures = {
        "vs_torchtrainer": median["TorchTrainer, uniform"] / ours_s,
        "vs_fastest_only": median["ours, fastest-only"] / ours_s,
        "measured_over_predicted": ours_s / predicted_s,
    }
    print(f"  throughput ours / TorchTrainer   {figures['vs_torchtrainer']:.2f}x  (target >= 1.5)")
    print(f"  throughput ours / fastest-only   {figures['vs_fastest_only']:.2f}x  (target >= 1.2)")
    print(
        f"  measured / predicted step time   {figures['measured_over_predicted']:.2f}"
        "  (target 0.85..1.15)"
    )
    print("  all speeds emulated on CPU")
    return figures


def homogeneous(job: WorkerJob, steps: int, rounds: int, work: Path) -> dict[str, float]:
    print(f"homogeneous (emulated): 4 x {FAST[0]} @{FAST[1]}")
    with emulated_cluster([(FAST[0], FAST[1], 4)]):
        result, profiles = plan_with_profiles(job, work)
        plan = result.plan  # type: ignore[attr-defined]
        predicted_s = result.estimate.step_time_s  # type: ignore[attr-defined]
        print(f"  planned plan     {describe(plan)}  (predicted {predicted_s:.4f} s)")
        runs = {
            "ours, planned": lambda: measure_ours(
                job,
                plan,
                steps,
                estimate=result.estimate,  # type: ignore[attr-defined]
                profiles=profiles,
            ),
            "TorchTrainer, uniform": lambda: (
                run_torchtrainer(job, GLOBAL_BATCH, 4, REFERENCE_SPEED, steps).step_time_s
            ),
        }
        if ONLY_OURS:
            runs.pop("TorchTrainer, uniform")
        median = rounds_of(runs, rounds)
    print(
        "  measured / predicted step time   "
        f"{median['ours, planned'] / predicted_s:.3f}  (homogeneous planned)"
    )
    if ONLY_OURS:
        return {"measured_over_predicted": median["ours, planned"] / predicted_s}
    ratio = median["ours, planned"] / median["TorchTrainer, uniform"]
    print(
        f"  median ours step {median['ours, planned']:.4f} s, "
        f"TorchTrainer step {median['TorchTrainer, uniform']:.4f} s"
    )
    print(f"  step time ours / TorchTrainer    {ratio:.3f}  (target <= 1.05)")
    print("  all speeds emulated on CPU")
    return {"homogeneous_step_ratio": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-homogeneous", action="store_true")
    parser.add_argument("--skip-heterogeneous", action="store_true")
    parser.add_argument(
        "--only-ours", action="store_true", help="our runtime only: measured against predicted"
    )
    parser.add_argument(
        "--microbatches",
        default=",".join(str(m) for m in MICROBATCHES),
        help="candidate microbatch sizes the planner chooses from",
    )
    parser.add_argument("--global-batch", type=int, default=GLOBAL_BATCH)
    parser.add_argument("--blocks", type=int, default=SHAPE.num_layers, help="transformer blocks")
    parser.add_argument(
        "--speeds",
        default=f"{FAST[1]},{SLOW[1]}",
        help="emulated speeds of the fast and the slow type, relative to the host CPU",
    )
    parser.add_argument(
        "--nodes",
        default=f"{NUM_FAST},{NUM_SLOW}",
        help="how many fast and how many slow one-CPU nodes (heterogeneous cluster)",
    )
    args = parser.parse_args()
    fast_speed, slow_speed = (float(x) for x in args.speeds.split(","))
    num_fast, num_slow = (int(x) for x in args.nodes.split(","))
    microbatches = [int(m) for m in args.microbatches.split(",")]
    configure(
        args.global_batch, args.blocks, fast_speed, slow_speed, num_fast, num_slow, microbatches
    )
    global ONLY_OURS
    ONLY_OURS = args.only_ours
    job = bench_job()
    print(f"load average at start: {load_average()} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.skip_heterogeneous:
            heterogeneous(job, args.steps, args.rounds, work)
        if not args.skip_homogeneous:
            homogeneous(job, args.steps, args.rounds, work)


if __name__ == "__main__":
    main()

"""A job whose training state fits no emulated device unsharded, planned sharded and run.

Four one-CPU Ray nodes labelled A100-80 at emulated speed 0.25 (bench/emulated_cluster.py). The
planner reads each device's memory from the device catalog; here the catalog's A100-80 is given
``--memory-mib`` MiB (1 MiB of it framework footprint), so that the GPT's largest layer (its
output head over an 8,192-token vocabulary, with its Adam state and activations) fits no device
whole. The model is profiled on the nodes (``orchestrator profile``'s machinery), then:

- the search without the sharded candidates refuses (its message printed in one line);
- the default search plans with sharding;
- our runtime runs that plan for ``--steps`` steps on the same nodes, printing measured against
  predicted step time and, per rank, the cost model's memory against the memory the rank counted
  (weights, gradients, optimizer state and activations at their peak:
  ``worker/memory_account.py``), both without the framework footprint.

Everything here is emulated on CPUs (speed and device memory). Nothing passes or fails; the
figures go to docs/benchmarks.md.

Run: .venv/bin/python bench/sharded_emulated.py [--steps 6] [--memory-mib 32]
     [--level full --microbatch 4]  (the planned replicas at another level, costed the same way)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import runtime_emulated as rt
from emulated_cluster import emulated_cluster

from orchestrator.costmodel import estimate_plan
from orchestrator.errors import InfeasibleError
from orchestrator.planner import make_plan
from orchestrator.planner.selection import SearchConfig
from orchestrator.runtime.discovery import cluster_from_nodes, discover_nodes
from orchestrator.runtime.profiling import profile_device_types
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.plan import Plan, Sharding
from orchestrator.spec.profiles import ProfileSet

MIB = 1024 * 1024
DEVICE, SPEED, NODES = "A100-80", 0.25, 4
# A vocabulary large enough that the output head is the layer that does not fit; two blocks keep
# the run short.
SHAPE = rt.SHAPE.model_copy(update={"num_layers": 2, "vocab_size": 8192})
GLOBAL_BATCH = 48
MICROBATCHES = [1, 2, 4]


def small_catalog(memory_mib: float) -> DeviceCatalog:
    """The built-in catalog with the emulated type's memory set to ``memory_mib`` MiB."""
    builtin = DeviceCatalog.builtin()
    small = builtin[DEVICE].model_copy(
        update={"memory_bytes": int(memory_mib * MIB), "framework_overhead_bytes": MIB}
    )
    return DeviceCatalog.builtin(extra=[small])


def at_level(plan: Plan, level: Sharding, microbatch: int) -> Plan:
    """``plan`` with every stage at ``level`` and microbatches of ``microbatch``."""
    replicas = tuple(
        r.model_copy(
            update={"stages": tuple(s.model_copy(update={"sharding": level}) for s in r.stages)}
        )
        for r in plan.replicas
    )
    return Plan.model_validate(
        plan.model_copy(update={"replicas": replicas, "microbatch_size": microbatch}).model_dump()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--memory-mib", type=float, default=32.0, help="each emulated device's")
    parser.add_argument(
        "--max-stages", type=int, default=1, help="training.max_pipeline_stages (1: no pipelines)"
    )
    parser.add_argument(
        "--level",
        choices=["optimizer", "gradients", "full"],
        help="run the planned replicas at this sharding level instead (costed the same way)",
    )
    parser.add_argument("--microbatch", type=int, help="with --level: the microbatch size")
    args = parser.parse_args()
    rt.configure(GLOBAL_BATCH, SHAPE.num_layers, SPEED, SPEED, NODES, 0, MICROBATCHES)
    rt.SHAPE = SHAPE
    job = rt.bench_job()
    training = rt.training().model_copy(update={"max_pipeline_stages": args.max_stages})
    print(f"load average at start: {rt.load_average()} on {os.cpu_count()} cores")
    print(
        f"emulated: {NODES} x {DEVICE} @{SPEED}, {args.memory_mib:g} MiB each (1 MiB framework);"
        f" gpt {SHAPE.num_layers} blocks, hidden {SHAPE.hidden_size}, vocab {SHAPE.vocab_size},"
        f" sequence {SHAPE.sequence_length}, fp32, adam, global batch {GLOBAL_BATCH}"
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, emulated_cluster([(DEVICE, SPEED, NODES)]):
        work = Path(tmp)
        nodes = discover_nodes()
        profile_device_types(
            job, nodes, MICROBATCHES, work / "profiles", work / "cache", out=lambda s: None
        )
        profiles = ProfileSet.load([work / "profiles"]).for_model(SHAPE.name)
        terms = profiles.runtime_constants(DEVICE, with_time_terms=True)
        if terms is not None and terms.gather_latency_s is not None:
            print(
                f"  gloo among 4 ranks (profiler, measured): gather"
                f" {terms.gather_latency_s * 1e3:.3f} ms + bytes /"
                f" {(terms.gather_bytes_per_s or 0) / 1e9:.3f} GB/s, reduce"
                f" {(terms.reduce_latency_s or 0) * 1e3:.3f} ms + bytes /"
                f" {(terms.reduce_bytes_per_s or 0) / 1e9:.3f} GB/s;"
                f" point-to-point latency {(terms.p2p_latency_s or 0) * 1e3:.3f} ms"
            )
        cluster = cluster_from_nodes(nodes, small_catalog(args.memory_mib))
        try:
            make_plan(cluster, SHAPE, training, profiles, SearchConfig(sharded=False))
            print("  unsharded search: a plan fits (the memory is not small enough)")
        except InfeasibleError as e:
            print(f"  unsharded search refuses: {' '.join(str(e).split())}")
        result = make_plan(cluster, SHAPE, training, profiles, SearchConfig())
        plan, estimate = result.plan, result.estimate
        print(f"  sharded plan     {rt.describe(plan)}  (predicted {estimate.step_time_s:.4f} s)")
        for line in result.choices:
            if line:
                print(f"  {line}")
        if args.level is not None:
            plan = at_level(plan, Sharding(args.level), args.microbatch or plan.microbatch_size)
            estimate = estimate_plan(plan, cluster, SHAPE, training, profiles)
            print(
                f"  run instead      {rt.describe(plan)}  (predicted {estimate.step_time_s:.4f} s)"
            )
        predicted_s = estimate.step_time_s
        for d in estimate.devices:
            print(
                f"    r{d.replica}s{d.stage} predicted memory"
                f" {(d.memory_bytes - d.framework_bytes) / MIB:.2f} MiB of"
                f" {(args.memory_mib - 1):g} MiB usable"
            )
        measured_s = rt.measure_ours(job, plan, args.steps, estimate=estimate, profiles=profiles)
    print(
        f"  measured step {measured_s:.4f} s, predicted {predicted_s:.4f} s,"
        f" measured / predicted {measured_s / predicted_s:.3f}"
    )
    print(
        f"  wall {time.perf_counter() - started:.0f} s, load average at end {rt.load_average()};"
        " speeds and device memory emulated on CPU"
    )


if __name__ == "__main__":
    main()

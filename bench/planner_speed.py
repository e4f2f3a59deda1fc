"""Search time of ``make_plan`` at 64, 1,024 and 10,240 GPUs (4 device types, 98 planner layers).

Run: .venv/bin/python bench/planner_speed.py [--sizes 64,1024,10240]
Prints one line per size: search seconds (wall clock, and the process's CPU seconds, which a
shared host disturbs less), predicted step time, ratio to the fluid bound and to the two
baselines. Targets (one core): <= 1 s at 64, <= 10 s at 1,024, <= 60 s at 10,240.
"""

from __future__ import annotations

import argparse
import time

from orchestrator.planner import make_plan
from orchestrator.spec import ClusterSpec, ModelSpec, TrainingSpec

TYPES = ("H100", "A100-80", "L4", "T4")  # 4 device types, 8 devices per node


def cluster_of(num_gpus: int) -> ClusterSpec:
    nodes_per_type = max(1, num_gpus // (8 * len(TYPES)))
    return ClusterSpec(
        node_groups=[
            {
                "name": t.lower(),
                "device_type": t,
                "num_nodes": nodes_per_type,
                "devices_per_node": 8,
            }
            for t in TYPES
        ]
    )


# GPT-3 13B-like shape with 96 blocks: 98 planner layers.
MODEL = ModelSpec(
    name="gpt-96L",
    num_layers=96,
    hidden_size=5120,
    num_heads=40,
    sequence_length=2048,
    vocab_size=50257,
    dtype="bf16",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="64,1024,10240")
    args = parser.parse_args()
    print(
        f"{'GPUs':>6} {'search s':>9} {'cpu s':>6} {'step s':>8} {'/bound':>7} "
        f"{'vs uniform DP':>14} {'vs fastest-only':>16}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        cluster = cluster_of(size).resolve()
        training = TrainingSpec(
            global_batch_size=max(256, size // 2), microbatch_sizes=[1, 2, 4, 8]
        )
        started, cpu_started = time.perf_counter(), time.process_time()
        result = make_plan(cluster, MODEL, training)
        wall_s = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        ratios = []
        for name in ("uniform_data_parallel", "fastest_type_only"):
            est = result.baselines[name].estimate
            ratios.append(
                f"{est.step_time_s / result.estimate.step_time_s:.2f}x" if est else "infeasible"
            )
        print(
            f"{cluster.num_devices:>6} {wall_s:>9.2f} {cpu_s:>6.2f} "
            f"{result.estimate.step_time_s:>8.3f} {result.bound_ratio:>7.3f} "
            f"{ratios[0]:>14} {ratios[1]:>16}"
        )


if __name__ == "__main__":
    main()

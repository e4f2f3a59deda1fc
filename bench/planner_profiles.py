"""Chosen plans against the fluid bound and the two baselines, on clusters built from the
measured profiles shipped with the package (converted from Sailor and Cephalo).

Run: .venv/bin/python bench/planner_profiles.py [--no-sharded]
(the default search, with the sharded data-parallel candidate; ``--no-sharded``: without it,
``SearchConfig(sharded=False)``, the search before it was on by default)
"""

from __future__ import annotations

import sys

from orchestrator.planner import make_plan
from orchestrator.planner.selection import SearchConfig
from orchestrator.profiles.builtin import builtin_model, builtin_profiles
from orchestrator.spec import ClusterSpec, TrainingSpec

CASES = [
    # (model, [(device type, nodes, devices per node)], global batch)
    ("OPT-350", [("A100-40", 1, 8), ("V100-16", 1, 8), ("RTX-3090", 2, 4)], 1024),
    ("OPT-350", [("GH-96", 2, 4), ("Titan-RTX", 4, 4), ("RTX-2080", 4, 4)], 1024),
    ("GPT-Neo-2.7", [("A100-80", 2, 8), ("V100-16", 4, 8)], 2048),
    ("GPT-Neo-2.7", [("A100-40", 4, 8), ("A100-80", 1, 8), ("V100-16", 2, 8)], 2048),
    ("OPT-30", [("GH-96", 4, 4), ("A100-40", 4, 8), ("V100-16", 8, 8)], 1024),
    ("GPT-2.7B-s512", [("A100-40", 1, 8), ("L4", 4, 4), ("T4", 4, 4), ("A10G", 2, 4)], 1024),
    ("LLaMA-7B-s512", [("A100-80", 1, 8), ("L40S", 2, 4), ("A10G", 4, 4), ("T4", 4, 4)], 512),
]


def main() -> None:
    print(
        f"{'model':<14} {'cluster':<40} {'step s':>8} {'/bound':>7} "
        f"{'vs uniform DP':>14} {'vs fastest-only':>16} {'search s':>8}"
    )
    for model_name, groups, batch in CASES:
        model = builtin_model(model_name)
        cluster = ClusterSpec(
            node_groups=[
                {"name": d.lower(), "device_type": d, "num_nodes": n, "devices_per_node": k}
                for d, n, k in groups
            ]
        ).resolve()
        training = TrainingSpec(global_batch_size=batch, microbatch_sizes=[1, 2, 4, 8])
        config = SearchConfig(sharded="--no-sharded" not in sys.argv)
        result = make_plan(cluster, model, training, builtin_profiles(model_name), config)
        cols = []
        for name in ("uniform_data_parallel", "fastest_type_only"):
            est = result.baselines[name].estimate
            cols.append(
                f"{est.step_time_s / result.estimate.step_time_s:.2f}x" if est else "infeasible"
            )
        label = " + ".join(f"{n * k}x {d}" for d, n, k in groups)
        print(
            f"{model_name:<14} {label:<40} {result.estimate.step_time_s:>8.3f} "
            f"{result.bound_ratio:>7.3f} {cols[0]:>14} {cols[1]:>16} {result.search_time_s:>8.2f}"
        )
        if result.estimated_device_types:
            print(f"{'':<14} estimated (no profile): {', '.join(result.estimated_device_types)}")
        for line in result.choices:
            print(f"{'':<14} {line}")


if __name__ == "__main__":
    main()

"""Plan quality against exhaustive enumeration on small clusters (<= 16 GPUs, 2-3 device types).

The exhaustive side enumerates every multiset of replica shapes that fits the devices: every
single-type pipeline (any depth, any tp) and every two-type pipeline (any split of depths, both
orders), at every microbatch size, each with its exact layer split, scored by the same cost model.
The planner's answer is compared with the best of them by predicted throughput (target >= 98%).

Run: .venv/bin/python bench/planner_quality.py
"""

from __future__ import annotations

import itertools
import math
import time

from orchestrator.costmodel import CostTables, estimate_with_tables
from orchestrator.planner import make_plan
from orchestrator.planner.batching import Group, selection_step_s
from orchestrator.planner.placement import place
from orchestrator.planner.templates import Template, build_template, type_infos
from orchestrator.profiles.builtin import builtin_model, builtin_profiles
from orchestrator.spec import ClusterSpec, ModelSpec, TrainingSpec


def all_templates(tables: CostTables, infos, mbs: int) -> list[Template]:
    out = []
    layers = tables.model.num_planner_layers
    for d, info in sorted(infos.items()):
        for tp in info.tp_options:
            for p in range(1, min(info.num_devices // tp, layers) + 1):
                t = build_template(tables, infos, ((d, tp),) * p, mbs)
                if t:
                    out.append(t)
    for a, b in itertools.permutations(sorted(infos), 2):
        for p1 in range(1, infos[a].num_devices + 1):
            for p2 in range(1, infos[b].num_devices + 1):
                if p1 + p2 <= layers:
                    t = build_template(tables, infos, ((a, 1),) * p1 + ((b, 1),) * p2, mbs)
                    if t:
                        out.append(t)
    return out


def _enumerate(templates: list[Template], free: dict[str, int], batch: int, infos, best) -> int:
    """Depth-first over every multiset of ``templates`` fitting ``free``; updates ``best``."""
    visited = 0

    def dfs(i: int, chosen: list[Group]) -> None:
        nonlocal visited
        if i == len(templates):
            if chosen:
                visited += 1
                step = selection_step_s(chosen, batch, infos)
                if step is not None and step < best[0]:
                    best[0], best[1] = step, list(chosen)
            return
        t = templates[i]
        most = min(free[d] // n for d, n in t.usage.items())
        for count in range(most, -1, -1):
            for d, n in t.usage.items():
                free[d] -= count * n
            dfs(i + 1, [*chosen, Group(t, count)] if count else chosen)
            for d, n in t.usage.items():
                free[d] += count * n

    dfs(0, [])
    return visited


def exhaustive(tables, infos, training) -> tuple[float, list[Group], int]:
    best: list = [math.inf, []]
    visited = 0
    for mbs in training.microbatch_sizes:
        free = {d: i.num_devices for d, i in infos.items()}
        templates = all_templates(tables, infos, mbs)
        visited += _enumerate(templates, free, training.global_batch_size, infos, best)
    return best[0], best[1], visited


CASES = [
    ("OPT-350", [("A100-40", 1, 4), ("V100-16", 1, 4)], 64),
    ("OPT-350", [("A100-40", 1, 2), ("RTX-2080", 2, 2), ("Titan-RTX", 1, 2)], 32),
    ("OPT-350", [("GH-96", 1, 2), ("RTX-3090", 1, 4), ("V100-16", 1, 2)], 64),
    ("GPT-Neo-2.7", [("A100-80", 1, 4), ("V100-16", 2, 4)], 32),
    ("GPT-Neo-2.7", [("A100-40", 2, 4), ("V100-16", 2, 4)], 64),
]


def main() -> None:
    print(
        f"{'model':<12} {'cluster':<36} {'GPUs':>4} {'plans':>8} "
        f"{'ours/opt':>9} {'ours s':>7} {'exh s':>7}"
    )
    worst = 1.0
    for model_name, groups, batch in CASES:
        model: ModelSpec = builtin_model(model_name)
        spec = ClusterSpec(
            node_groups=[
                {"name": f"{d.lower()}", "device_type": d, "num_nodes": n, "devices_per_node": k}
                for d, n, k in groups
            ]
        )
        cluster = spec.resolve()
        training = TrainingSpec(global_batch_size=batch, microbatch_sizes=[1, 2, 4])
        profiles = builtin_profiles(model_name)
        t0 = time.perf_counter()
        ours = make_plan(cluster, model, training, profiles)
        ours_s = time.perf_counter() - t0
        tables = CostTables.for_cluster(model, training, cluster, profiles)
        infos = type_infos(cluster, model, training)
        t0 = time.perf_counter()
        _, best_groups, visited = exhaustive(tables, infos, training)
        exh_s = time.perf_counter() - t0
        opt = estimate_with_tables(place(best_groups, cluster, batch), cluster, tables)
        ratio = opt.step_time_s / ours.estimate.step_time_s  # throughput ratio ours / optimum
        worst = min(worst, ratio)
        label = " + ".join(f"{n * k}x {d}" for d, n, k in groups)
        print(
            f"{model_name:<12} {label:<36} {cluster.num_devices:>4} {visited:>8} "
            f"{ratio:>9.3f} {ours_s:>7.2f} {exh_s:>7.1f}"
        )
    print(f"worst ours/optimum: {worst:.3f} (target >= 0.98)")


if __name__ == "__main__":
    main()

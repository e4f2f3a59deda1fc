"""Plan quality against an independent enumeration that shares only the cost model's estimate.

The enumerator knows nothing of the planner (no templates, no split solver, no batching, no
placement of its own): it builds ``Plan`` objects directly and scores each with
``estimate_with_tables``. It enumerates, on small instances (8 GPUs, 2-3 device types, a model of
few planner layers so that the enumeration ends):

* every replica shape: a sequence of stages, each a device type and a tensor-parallel degree that
  divides its nodes (at most three types per pipeline), using at most the devices present;
* every contiguous split of the layers into that many stages;
* every multiset of such replicas that fits the devices (devices may stay idle);
* every microbatch size of the training spec;
* every division of the global batch among the replicas, solved exactly rather than listed: with
  the stages' per-microbatch times fixed by the plan, a replica's pipeline time is
  ``(m - 1) max_s T_s + sum_s T_s`` in its microbatch count ``m`` and the all-reduce tail does not
  depend on the division, so the best division is found by bisection over the step time
  (water-filling), then confirmed by a full estimate of the plan.

Stages are placed first-fit (a stage on the node of the replica's previous stage when it has room,
else the first node of its type with room), one placement per multiset: the optimum is over
shapes, splits, tp, microbatch sizes and divisions, not over node placements.

Prints ours/optimum as a throughput ratio (optimum step time over ours; target >= 0.98) and, where
we fall short, both plans.

Run: .venv/bin/python bench/planner_quality.py [--cases a,b]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.costmodel import CostTables, estimate_with_tables
from orchestrator.planner import make_plan
from orchestrator.spec import ClusterSpec, ModelSpec, Plan, TrainingSpec
from orchestrator.spec.cluster import Cluster

Stage = tuple[str, int]  # (device type, tp)


@dataclass(frozen=True)
class Replica:
    stages: tuple[Stage, ...]
    bounds: tuple[int, ...]  # p + 1 layer boundaries

    def usage(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t, tp in self.stages:
            out[t] = out.get(t, 0) + tp
        return out


def replica_options(cluster: Cluster, num_layers: int) -> list[Replica]:
    """Every replica shape with every contiguous split (see module docstring)."""
    avail = cluster.device_counts
    stage_opts = [
        (t, tp)
        for t in sorted(avail)
        for tp in (1, 2, 4, 8)
        if all(n.num_devices % tp == 0 for n in cluster.nodes_of_type(t))
    ]
    shapes: list[tuple[Stage, ...]] = []

    def grow(seq: list[Stage], use: dict[str, int]) -> None:
        if seq:
            shapes.append(tuple(seq))
        if len(seq) == num_layers:
            return
        for t, tp in stage_opts:
            if use.get(t, 0) + tp <= avail[t] and len({s[0] for s in seq} | {t}) <= 3:
                grow([*seq, (t, tp)], {**use, t: use.get(t, 0) + tp})

    grow([], {})
    out = []
    for shape in shapes:
        for cuts in itertools.combinations(range(1, num_layers), len(shape) - 1):
            out.append(Replica(shape, (0, *cuts, num_layers)))
    return out


def multisets(options: list[Replica], avail: dict[str, int]) -> Iterator[list[Replica]]:
    """Every non-empty multiset of ``options`` whose devices fit ``avail``."""
    usages = [o.usage() for o in options]

    def rec(start: int, free: dict[str, int], chosen: list[Replica]) -> Iterator[list[Replica]]:
        if chosen:
            yield chosen
        for i in range(start, len(options)):
            u = usages[i]
            if all(free[t] >= n for t, n in u.items()):
                for t, n in u.items():
                    free[t] -= n
                yield from rec(i, free, [*chosen, options[i]])
                for t, n in u.items():
                    free[t] += n

    yield from rec(0, dict(avail), [])


def first_fit(cluster: Cluster, replicas: list[Replica]) -> list[list[str]] | None:
    free = {n.name: n.num_devices for n in cluster.nodes}
    out = []
    for rep in replicas:
        nodes: list[str] = []
        for t, tp in rep.stages:
            candidates = [n.name for n in cluster.nodes_of_type(t) if free[n.name] >= tp]
            if not candidates:
                return None
            node = nodes[-1] if nodes and nodes[-1] in candidates else candidates[0]
            free[node] -= tp
            nodes.append(node)
        out.append(nodes)
    return out


def to_plan(replicas, nodes, batches, mbs, batch) -> Plan:
    return Plan(
        global_batch_size=batch,
        microbatch_size=mbs,
        replicas=[
            {
                "batch_size": b,
                "stages": [
                    {
                        "layers": [r.bounds[i], r.bounds[i + 1]],
                        "device_type": t,
                        "tp": tp,
                        "node": n,
                    }
                    for i, ((t, tp), n) in enumerate(zip(r.stages, ns, strict=True))
                ],
            }
            for r, ns, b in zip(replicas, nodes, batches, strict=True)
        ],
    )


def best_division(per_stage: list[list[float]], mbs: int, batch: int) -> list[int] | None:
    """Batch sizes (sum ``batch``, each >= 1) minimising the slowest replica's pipeline time."""
    r = len(per_stage)
    if batch < r:
        return None
    big = [max(t) for t in per_stage]
    tot = [sum(t) for t in per_stage]

    def capacity(limit: float) -> list[int]:
        # Most samples each replica can take within ``limit``: m microbatches of mbs.
        out = []
        for b, s in zip(big, tot, strict=True):
            m = 0 if limit < s else int((limit - s) / b + 1e-12) + 1 if b > 0 else batch
            out.append(min(m * mbs, batch))
        return out

    lo, hi = 0.0, max((math.ceil(batch / mbs) - 1) * b + s for b, s in zip(big, tot, strict=True))
    for _ in range(100):
        mid = (lo + hi) / 2
        cap = capacity(mid)
        if sum(cap) >= batch and min(cap) >= 1:
            hi = mid
        else:
            lo = mid
    cap = capacity(hi)
    if min(cap) < 1 or sum(cap) < batch:
        return None
    # Hand out the batch: every replica at least one sample, the rest up to capacity.
    sizes = [1] * r
    left = batch - r
    for i in sorted(range(r), key=lambda i: big[i]):
        take = min(left, cap[i] - 1)
        sizes[i] += take
        left -= take
    return sizes if left == 0 else None


def optimum(cluster: Cluster, tables: CostTables, training: TrainingSpec):
    n = tables.model.num_planner_layers
    options = replica_options(cluster, n)
    best = (math.inf, None)
    count = 0
    batch = training.global_batch_size
    for reps in multisets(options, cluster.device_counts):
        nodes = first_fit(cluster, reps)
        if nodes is None:
            continue
        for mbs in training.microbatch_sizes:
            if len(reps) * mbs > batch and mbs > 1:
                continue
            share = [max(1, batch // len(reps))] * len(reps)
            share[0] += batch - sum(share)
            if min(share) < 1:
                continue
            probe = estimate_with_tables(to_plan(reps, nodes, share, mbs, batch), cluster, tables)
            count += 1
            if not probe.fits:
                continue
            per_stage: list[list[float]] = [[] for _ in reps]
            for d in probe.devices:
                per_stage[d.replica].append(d.microbatch_s)
            sizes = best_division(per_stage, mbs, batch)
            if sizes is None:
                continue
            tail = probe.step_time_s - probe.pipeline_s
            pipes = [
                (math.ceil(b / mbs) - 1) * max(t) + sum(t)
                for b, t in zip(sizes, per_stage, strict=True)
            ]
            if max(pipes) + tail >= best[0] * (1 - 1e-9):
                continue
            plan = to_plan(reps, nodes, sizes, mbs, batch)
            est = estimate_with_tables(plan, cluster, tables)
            if est.fits and est.step_time_s < best[0]:
                best = (est.step_time_s, plan)
    return best[0], best[1], count


def small_model(num_blocks: int, hidden_size: int = 2048) -> ModelSpec:
    return ModelSpec(
        name=f"gpt-{num_blocks}x{hidden_size}",
        num_layers=num_blocks,
        hidden_size=hidden_size,
        num_heads=16,
        sequence_length=2048,
        vocab_size=32000,
        dtype="bf16",
    )


# (node groups, blocks, global batch, hidden size). The wide model's blocks (~450M parameters,
# 7 GiB of training state each) do not fit two to a V100-16 or one to a T4, so memory shapes the
# pipelines and every device's compute counts.
CASES = {
    "a100+v100": ([("A100-40", 1, 4), ("V100-16", 1, 4)], 2, 16, 2048),
    "a100+t4": ([("A100-40", 1, 4), ("T4", 2, 2)], 2, 16, 2048),
    "3 types": ([("A100-40", 1, 2), ("V100-16", 1, 2), ("T4", 2, 2)], 2, 16, 2048),
    "wide": ([("A100-40", 1, 4), ("V100-16", 1, 4)], 2, 32, 6144),
}


def describe(plan: Plan) -> str:
    parts = []
    for r in plan.replicas:
        stages = "|".join(f"{s.device_type}x{s.tp}[{s.layers[0]},{s.layers[1]})" for s in r.stages)
        parts.append(f"b{r.batch_size}:{stages}")
    return f"mbs {plan.microbatch_size}: " + " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    print(f"{'case':<10} {'GPUs':>4} {'layers':>6} {'plans':>7} {'ours/opt':>9} {'opt s':>6}")
    worst = math.inf
    for name in args.cases.split(","):
        groups, blocks, batch, hidden = CASES[name]
        model = small_model(blocks, hidden)
        spec = ClusterSpec(
            node_groups=[
                {"name": f"{d.lower()}", "device_type": d, "num_nodes": n, "devices_per_node": k}
                for d, n, k in groups
            ]
        )
        cluster = spec.resolve()
        training = TrainingSpec(global_batch_size=batch, microbatch_sizes=[1, 2, 4])
        ours = make_plan(cluster, model, training)
        tables = CostTables.for_cluster(model, training, cluster)
        t0 = time.perf_counter()
        opt_s, opt_plan, count = optimum(cluster, tables, training)
        took = time.perf_counter() - t0
        ratio = opt_s / ours.estimate.step_time_s
        worst = min(worst, ratio)
        print(
            f"{name:<10} {cluster.num_devices:>4} {model.num_planner_layers:>6} {count:>7} "
            f"{ratio:>9.4f} {took:>6.0f}"
        )
        if ratio < 0.98 and opt_plan is not None:
            print(f"  ours    {ours.estimate.step_time_s:.4f} s  {describe(ours.plan)}")
            print(f"  optimum {opt_s:.4f} s  {describe(opt_plan)}")
    print(f"worst ours/optimum: {worst:.3f} (target >= 0.98)")


if __name__ == "__main__":
    main()

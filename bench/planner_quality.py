"""Plan quality against an independent enumeration that shares only the cost model's estimate.

The enumerator knows nothing of the planner (no templates, no split solver, no batching, no
placement of its own): it builds ``Plan`` objects directly and scores each with
``estimate_with_tables``. It enumerates, on small instances (8-10 GPUs, 2-3 device types, a
model of few planner layers so that the enumeration ends):

* every replica shape: a sequence of stages, each a device type and a tensor-parallel degree that
  divides its nodes (at most three types per pipeline), using at most the devices present;
* every contiguous split of the layers into that many stages;
* every multiset of such replicas that fits the devices (devices may stay idle);
* every microbatch size of the training spec;
* for plans whose stages all run at tp 1 (the engine shards those only), the state unsharded or
  sharded over the replicas at each level (optimizer, gradients, full), one level per plan;
* every division of the global batch among the replicas, solved exactly rather than listed: with
  the stages' per-microbatch times fixed by the plan, a replica's pipeline time is
  ``(m - 1) max_s T_s + sum_s T_s`` in its microbatch count ``m`` and the all-reduce tail does not
  depend on the division, so the best division is found by bisection over the step time
  (water-filling), then confirmed by a full estimate of the plan.

Exact pruning keeps it fast: a replica's stage times depend only on its own stages and nodes, so
each is costed once alone; a multiset whose lower bound (the pipeline time of the relaxed batch
division, plus the slowest stage's optimizer step where nothing is sharded, plus the per-step
overhead) is no better than the best plan found is not costed in full.

Stages are placed first-fit (a stage on the node of the replica's previous stage when it has room,
else the first node of its type with room), one placement per multiset: the optimum is over
shapes, splits, tp, sharding, microbatch sizes and divisions, not over node placements, nor over
activation recompute (no case here needs it).

Prints, per case, ours and the optimum (types, stages with their layers and tp, batch shares),
and ours/optimum as a throughput ratio (optimum step time over ours; target >= 0.98).

Run: .venv/bin/python bench/planner_quality.py [--cases a,b]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from dataclasses import dataclass

from orchestrator.costmodel import CostTables, estimate_with_tables
from orchestrator.planner import make_plan
from orchestrator.spec import ClusterSpec, ModelSpec, Plan, TrainingSpec
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.plan import Sharding

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


def to_plan(replicas, nodes, batches, mbs, batch, sharding: Sharding = Sharding.NONE) -> Plan:
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
                        "sharding": sharding,
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


@dataclass
class _Cached:
    """One replica at one placement and microbatch size, costed alone."""

    stage_s: list[float]
    bottleneck_s: float
    sum_s: float
    update_s: float  # the slowest stage's optimizer step


def _alone(
    rep: Replica, nodes: tuple[str, ...], mbs: int, cluster: Cluster, tables: CostTables
) -> _Cached:
    # A replica's per-microbatch stage times depend only on its own stages and nodes, so the
    # estimate of the replica alone gives exactly what it contributes to any plan it is part of.
    est = estimate_with_tables(to_plan([rep], [list(nodes)], [mbs], mbs, mbs), cluster, tables)
    stage_s = [d.microbatch_s for d in est.devices]
    return _Cached(stage_s, max(stage_s), sum(stage_s), max(d.update_s for d in est.devices))


def _pipeline_bound_s(reps: list[_Cached], microbatches: int) -> float:
    """A lower bound on the pipeline time of these replicas over any division of the batch.

    A replica running ``m >= 1`` microbatches by ``T`` has ``m <= (T - sum_s) / max_s + 1``;
    summed over the replicas these cover ``microbatches``, which bounds ``T`` from below."""
    inv = sum(1.0 / c.bottleneck_s for c in reps)
    offset = sum(c.sum_s / c.bottleneck_s for c in reps)
    relaxed = (microbatches - len(reps) + offset) / inv
    return max(relaxed, max(c.sum_s for c in reps))


def optimum(cluster: Cluster, tables: CostTables, training: TrainingSpec):
    """The fastest plan of the space in the module docstring: (step s, plan, plans costed)."""
    n = tables.model.num_planner_layers
    options = replica_options(cluster, n)
    batch = training.global_batch_size
    sizes = [m for m in training.microbatch_sizes if m <= batch]
    overhead = {t: tables.step_overhead_s(t) for t in cluster.device_types}
    # Options grouped by their device usage, so a class that does not fit is skipped at once.
    by_usage: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for i, o in enumerate(options):
        by_usage.setdefault(tuple(sorted(o.usage().items())), []).append(i)
    classes = sorted(by_usage.items())
    cache: dict[tuple[int, tuple[str, ...], int], _Cached] = {}
    node_type = {nd.name: nd.device_type.name for nd in cluster.nodes}
    best: list[object] = [math.inf, None]
    count = [0, 0]  # multisets seen, multisets costed in full

    def cached(i: int, nodes: tuple[str, ...], mbs: int) -> _Cached:
        key = (i, nodes, mbs)
        found = cache.get(key)
        if found is None:
            found = cache[key] = _alone(options[i], nodes, mbs, cluster, tables)
        return found

    def place(rep: Replica, free: dict[str, int]) -> tuple[str, ...] | None:
        nodes: list[str] = []
        for t, tp in rep.stages:
            candidates = [nd.name for nd in cluster.nodes_of_type(t) if free[nd.name] >= tp]
            if not candidates:
                return None
            node = nodes[-1] if nodes and nodes[-1] in candidates else candidates[0]
            free[node] -= tp
            nodes.append(node)
        return tuple(nodes)

    def evaluate(chosen: list[int], placed: list[tuple[str, ...]]) -> None:
        count[0] += 1
        reps = [options[i] for i in chosen]
        step_extra = max(overhead[node_type[nd]] for ns in placed for nd in ns)
        # Sharded state over the replicas, one level for the whole plan, where our engine runs
        # it (tp-1 stages only): it changes memory and the tail, never the pipeline.
        levels = [Sharding.NONE]
        if len(reps) > 1 and all(tp == 1 for r in reps for _, tp in r.stages):
            levels += [Sharding.OPTIMIZER, Sharding.GRADIENTS, Sharding.FULL]
        for mbs in sizes:
            if (len(reps) * mbs > batch and mbs > 1) or len(reps) > batch:
                continue
            alone = [cached(i, ns, mbs) for i, ns in zip(chosen, placed, strict=True)]
            # A sharded holder updates a slice only: the optimizer step is not bounded below.
            update = max(c.update_s for c in alone) if len(levels) == 1 else 0.0
            bound = _pipeline_bound_s(alone, math.ceil(batch / mbs)) + update + step_extra
            if bound >= best[0] * (1 - 1e-9):
                continue
            count[1] += 1
            nodes = [list(ns) for ns in placed]
            per_stage = [c.stage_s for c in alone]
            division = best_division(per_stage, mbs, batch)
            if division is None:
                continue
            share = [max(1, batch // len(reps))] * len(reps)
            share[0] += batch - sum(share)
            pipes = [
                (math.ceil(b / mbs) - 1) * max(t) + sum(t)
                for b, t in zip(division, per_stage, strict=True)
            ]
            for level in levels:
                probe = estimate_with_tables(
                    to_plan(reps, nodes, share, mbs, batch, level), cluster, tables
                )
                if not probe.fits:
                    continue
                tail = probe.step_time_s - probe.pipeline_s
                if max(pipes) + tail >= best[0] * (1 - 1e-9):
                    continue
                plan = to_plan(reps, nodes, division, mbs, batch, level)
                est = estimate_with_tables(plan, cluster, tables)
                if est.fits and est.step_time_s < best[0]:
                    best[0], best[1] = est.step_time_s, plan

    def grow(
        start: tuple[int, int],
        free: dict[str, int],
        left: dict[str, int],
        chosen: list[int],
        placed: list[tuple[str, ...]],
    ) -> None:
        if chosen:
            evaluate(chosen, placed)
        first_class, first_option = start
        for c in range(first_class, len(classes)):
            usage, members = classes[c]
            if any(left[t] < k for t, k in usage):
                continue
            for j in range(first_option if c == first_class else 0, len(members)):
                i = members[j]
                trial = dict(free)
                nodes = place(options[i], trial)
                if nodes is None:
                    continue
                grow(
                    (c, j),
                    trial,
                    {t: left[t] - dict(usage).get(t, 0) for t in left},
                    [*chosen, i],
                    [*placed, nodes],
                )

    grow(
        (0, 0),
        {nd.name: nd.num_devices for nd in cluster.nodes},
        dict(cluster.device_counts),
        [],
        [],
    )
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


@dataclass(frozen=True)
class Case:
    """One instance: node groups (device type, nodes, devices per node) and the job."""

    groups: tuple[tuple[str, int, int], ...]
    blocks: int
    global_batch: int
    hidden_size: int = 2048
    # Node-to-node bandwidth (None: the cluster default, 100 Gb/s Ethernet).
    inter_node_bytes_per_s: float | None = None
    microbatch_sizes: tuple[int, ...] = (1, 2, 4)

    def cluster(self) -> Cluster:
        groups = [
            {"name": d.lower(), "device_type": d, "num_nodes": n, "devices_per_node": k}
            for d, n, k in self.groups
        ]
        network = (
            {}
            if self.inter_node_bytes_per_s is None
            else {"network": {"inter_node_bandwidth_bytes_per_s": self.inter_node_bytes_per_s}}
        )
        return ClusterSpec(node_groups=groups, **network).resolve()


IB = 100e9  # 4 x 200 Gb/s InfiniBand per node, in bytes/s
CASES = {
    # Small, communication-bound jobs (global batch 16): one node of the fastest type wins, so
    # these check that the planner does not add slow devices where they hurt. The wide model's
    # blocks (~450M parameters, 7 GiB of training state each) do not fit two to a V100-16 or one
    # to a T4. V100 and T4 have no bf16 units: the bf16 model runs at their fp32 rate.
    "a100+v100": Case((("A100-40", 1, 4), ("V100-16", 1, 4)), 2, 16),
    "a100+t4": Case((("A100-40", 1, 4), ("T4", 2, 2)), 2, 16),
    "3 types": Case((("A100-40", 1, 2), ("V100-16", 1, 2), ("T4", 2, 2)), 2, 16),
    "wide": Case((("A100-40", 1, 4), ("V100-16", 1, 4)), 2, 32, 6144),
    # Compute-bound jobs (global batch 128) on types with bf16 units, where every device pays:
    # data parallel across types with uneven batch shares.
    "dp a100+a6000": Case((("A100-40", 1, 4), ("A6000", 1, 4)), 2, 128, 2048, IB),
    "dp 2x2 nodes": Case((("A100-40", 2, 2), ("A10G", 2, 2)), 2, 128),
    "dp 3 types": Case((("A100-40", 2, 2), ("A6000", 1, 2), ("A10G", 1, 2)), 2, 128, 2048, IB),
    "dp 10 GPUs": Case((("A100-40", 2, 2), ("A10G", 3, 2)), 2, 128),
    # A model whose training state (1.8B parameters, ~28 GB unsharded) does not fit one L4: the
    # L4s run in pipelines, alone or behind A100s, or with their state sharded.
    "pipe a100+l4": Case((("A100-40", 1, 4), ("L4", 2, 2)), 3, 64, 6144, IB),
    # The same model on three types: sharded data parallel lets it fit one device of each.
    "fit 3 types": Case((("A100-40", 1, 2), ("A10G", 1, 2), ("L4", 2, 2)), 3, 64, 6144, IB),
}


def describe(plan: Plan) -> str:
    parts = []
    for r in plan.replicas:
        stages = "|".join(f"{s.device_type}x{s.tp}[{s.layers[0]},{s.layers[1]})" for s in r.stages)
        parts.append(f"b{r.batch_size}:{stages}")
    levels = {s.sharding for r in plan.replicas for s in r.stages} - {Sharding.NONE}
    shard = f" sharded {'/'.join(sorted(levels))}" if levels else ""
    return f"mbs {plan.microbatch_size}{shard}: " + " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    worst = math.inf
    for name in args.cases.split(","):
        case = CASES[name]
        cluster = case.cluster()
        model = small_model(case.blocks, case.hidden_size)
        training = TrainingSpec(
            global_batch_size=case.global_batch, microbatch_sizes=list(case.microbatch_sizes)
        )
        ours = make_plan(cluster, model, training)
        tables = CostTables.for_cluster(model, training, cluster)
        t0 = time.perf_counter()
        opt_s, opt_plan, (seen, costed) = optimum(cluster, tables, training)
        took = time.perf_counter() - t0
        ratio = opt_s / ours.estimate.step_time_s
        worst = min(worst, ratio)
        print(
            f"{name}: {cluster.num_devices} GPUs {'+'.join(sorted(cluster.device_types))}, "
            f"{model.num_planner_layers} layers (hidden {case.hidden_size}), global batch "
            f"{case.global_batch}; {seen} multisets, {costed} costed in full, {took:.0f} s"
        )
        print(f"  ours     {ours.estimate.step_time_s:.4f} s  {describe(ours.plan)}")
        if opt_plan is not None:
            print(f"  optimum  {opt_s:.4f} s  {describe(opt_plan)}")
        print(f"  ours/opt {ratio:.4f}", flush=True)
    print(f"worst ours/optimum: {worst:.3f} (target >= 0.98)")


if __name__ == "__main__":
    main()

"""Sharding inside pipelines: replicas of one pipeline shape shard a stage's state among them.

The ranks that hold the same stage of identical replicas (same device types, tp and layer split)
are a shard group for that stage's layers (``worker/topology.shard_groups``). Two ways in:

- *Where it pays*: from a fitting plan, the stage that sets the step's tail (the slowest
  all-reduce plus optimizer update) is sharded across its replicas at one level, costed by the
  full model, and kept only if the step ends at least 0.5% sooner than unsharded; repeated on
  the new tail until nothing improves. Sharding divides a stage's optimizer step by its
  group's size and, in our cost model, moves no more than the all-reduce it replaces when every
  holder shards.
- *Where it is needed to fit*: single-type pipelines whose state fits a device only as one of
  ``k`` sharding holders (``templates.homogeneous_templates(sharded=...)``) join the selection,
  which keeps ``k`` replicas of such a shape or none.
- *Where a shape wins only sharded*: the same selection, with those pipelines offered on every
  device type even where an unsharded plan fits (a shallower pipeline, fewer bubbles, that fits
  only with its state sharded across its replicas); then sharded where it pays as above.

One level per plan (a layer's sharded holders must agree on it); tp-1 stages only (the engine
shards tp-1 stages). Pure.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.costmodel import Estimate, estimate_with_tables
from orchestrator.costmodel.tables import CostTables
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.plan import Plan, ReplicaSpec, Sharding

# Greedy rounds of "shard the tail's stage": each round one full estimate per level.
MAX_ROUNDS = 8
# Sharding is kept only for a step at least this much shorter than the unsharded plan's: a
# sharded layer's whole state lives only across its group, which a rounding-size gain does not
# buy.
MIN_GAIN = 0.005

Shape = tuple[tuple[tuple[int, int], str, int], ...]


def _shape(replica: ReplicaSpec) -> Shape:
    return tuple((st.layers, st.device_type, st.tp) for st in replica.stages)


def _with_stage_sharded(plan: Plan, shape: Shape, stage: int, level: Sharding) -> Plan:
    replicas = []
    for rep in plan.replicas:
        if _shape(rep) == shape:
            stages = list(rep.stages)
            stages[stage] = stages[stage].model_copy(update={"sharding": level})
            rep = rep.model_copy(update={"stages": tuple(stages)})
        replicas.append(rep)
    return plan.model_copy(update={"replicas": tuple(replicas)})


def shard_where_it_pays(
    plan: Plan, estimate: Estimate, cluster: Cluster, tables: CostTables, level: Sharding
) -> tuple[tuple[Plan, Estimate], tuple[Plan, Estimate] | None]:
    """``plan`` with the stages whose sharding at ``level`` shortens the step sharded (greedy on
    the step's tail, each change costed by the full model; ``plan`` itself if none does), and
    the last sharded plan costed (None if no stage could shard)."""
    counts: dict[Shape, int] = {}
    for rep in plan.replicas:
        counts[_shape(rep)] = counts.get(_shape(rep), 0) + 1
    best = current = (plan, estimate)
    last: tuple[Plan, Estimate] | None = None
    tried: set[tuple[Shape, int]] = set()
    for _ in range(MAX_ROUNDS):
        plan_now, est = current
        worst = max(est.devices, key=lambda d: (d.allreduce_s + d.update_s, -d.replica))
        rep = plan_now.replicas[worst.replica]
        shape, stage = _shape(rep), worst.stage
        st = rep.stages[stage]
        if (
            counts[shape] < 2
            or st.tp != 1
            or st.sharding is not Sharding.NONE
            or (shape, stage) in tried
        ):
            break
        tried.add((shape, stage))
        trial = _with_stage_sharded(plan_now, shape, stage, level)
        trial_est = estimate_with_tables(trial, cluster, tables)
        last = (trial, trial_est)
        # Stages tied on the tail are sharded one per round: a change that leaves the step
        # as it was (another stage still sets it) is carried on, one that lengthens it ends.
        if not trial_est.fits or trial_est.step_time_s > est.step_time_s * (1 + 1e-12):
            break
        current = last
        if trial_est.step_time_s < min(
            best[1].step_time_s * (1 - 1e-9), estimate.step_time_s * (1 - MIN_GAIN)
        ):
            best = last
    return best, last


def levels_for(tables: CostTables) -> tuple[Sharding, ...]:
    """Levels worth trying on this runtime: ``full`` only where it gathers layer by layer (ours
    gathers a step's parameters once, so ``full`` holds no less than ``gradients``)."""
    if tables.runtime.gathered_layers is None:
        return (Sharding.OPTIMIZER, Sharding.GRADIENTS)
    return (Sharding.OPTIMIZER, Sharding.GRADIENTS, Sharding.FULL)


def _dominated(level: Sharding, tables: CostTables) -> bool:
    """Whether a lower level offers the same shapes at no more cost: on a runtime that holds
    gradients whole at the step's peak and reduces sharded gradients only after the backward,
    ``gradients`` keeps what ``optimizer`` keeps, moves what it moves, and blocks the
    all-reduce besides."""
    runtime = tables.runtime
    return (
        level is Sharding.GRADIENTS
        and runtime.whole_gradients_at_peak
        and runtime.blocks_sharded_reduction
    )


def sharded_pipelines(
    cluster: Cluster,
    tables: CostTables,
    unsharded: tuple[Plan, Estimate] | None,
    needed: bool,
    place_sharded: Callable[[Sharding], Plan | None],
    pays: bool = True,
    place_anywhere: Callable[[Sharding], Plan | None] | None = None,
) -> tuple[Plan, Estimate] | None:
    """The fastest fitting plan with pipeline stages sharded (faster than ``unsharded`` or
    not: the caller compares), or None.

    ``unsharded``: the best unsharded plan (its stages sharded where it pays, when ``pays``);
    ``needed``: also search with pipelines that fit only sharded (``place_sharded(level)``: the
    placed best selection with them offered, or None); ``place_anywhere``: with ``pays``, also
    search with them offered on every device type (a shape that wins only once sharded, where
    an unsharded plan fits too), its stages then sharded where it pays as well.
    """
    best: tuple[Plan, Estimate] | None = None

    def keep(found: tuple[Plan, Estimate]) -> None:
        nonlocal best
        sharded = any(
            st.sharding is not Sharding.NONE for r in found[0].replicas for st in r.stages
        )
        better = best is None or found[1].step_time_s < best[1].step_time_s
        if sharded and found[1].fits and better:
            best = found

    def keep_greedy(plan: Plan, est: Estimate, level: Sharding) -> None:
        found, last = shard_where_it_pays(plan, est, cluster, tables, level)
        keep(found)
        if last is not None:
            keep(last)  # costed and shown even where not faster

    for level in levels_for(tables):
        if unsharded is not None and pays:
            keep_greedy(*unsharded, level)
        # A dominated level offers the shapes the level below offers, at no less cost: its
        # selections are not searched (the greedy above still costs it on the plan at hand).
        dominated = _dominated(level, tables)
        searches = [place_sharded] if needed and not dominated else []
        if pays and place_anywhere is not None and not dominated:
            searches.append(place_anywhere)
        for search in searches:
            plan = search(level)
            if plan is not None:
                est = estimate_with_tables(plan, cluster, tables)
                keep((plan, est))
                if est.fits and pays:
                    keep_greedy(plan, est, level)
    return best

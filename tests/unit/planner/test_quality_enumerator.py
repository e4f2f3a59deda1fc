"""The quality benchmark's enumerator (bench/planner_quality.py) against plans listed one by one.

On a two-device instance small enough to list every plan explicitly -- each device alone, every
two-stage pipeline in both orders at every split, both devices a replica each with every division
of the batch at every sharding level -- the enumerator's optimum (water-filled division,
bound-pruned multisets) must be the listed minimum, and that minimum is a mixed plan: both device
types with uneven shares.
"""

from __future__ import annotations

import math

from bench.planner_quality import Case, Replica, describe, optimum, small_model, to_plan
from orchestrator.costmodel import CostTables, estimate_with_tables
from orchestrator.spec import Plan, TrainingSpec
from orchestrator.spec.plan import Sharding


def _listed_minimum(case: Case) -> tuple[float, Plan]:
    cluster = case.cluster()
    model = small_model(case.blocks, case.hidden_size)
    training = TrainingSpec(
        global_batch_size=case.global_batch, microbatch_sizes=list(case.microbatch_sizes)
    )
    tables = CostTables.for_cluster(model, training, cluster)
    layers = model.num_planner_layers
    node = {n.device_type.name: n.name for n in cluster.nodes}
    fast, slow = sorted(node)
    batch = case.global_batch

    best: tuple[float, Plan | None] = (math.inf, None)
    for mbs in case.microbatch_sizes:
        plans = []
        for t in (fast, slow):  # one device alone
            plans.append(
                to_plan([Replica(((t, 1),), (0, layers))], [[node[t]]], [batch], mbs, batch)
            )
        for a, b in ((fast, slow), (slow, fast)):  # two-stage pipelines
            for cut in range(1, layers):
                rep = Replica(((a, 1), (b, 1)), (0, cut, layers))
                plans.append(to_plan([rep], [[node[a], node[b]]], [batch], mbs, batch))
        whole = [Replica(((t, 1),), (0, layers)) for t in (fast, slow)]
        for share in range(1, batch):  # data parallel across the two, every division
            for level in Sharding:  # its state sharded over the two replicas at each level
                plans.append(
                    to_plan(
                        whole,
                        [[node[fast]], [node[slow]]],
                        [share, batch - share],
                        mbs,
                        batch,
                        level,
                    )
                )
        for plan in plans:
            est = estimate_with_tables(plan, cluster, tables)
            if est.fits and est.step_time_s < best[0]:
                best = (est.step_time_s, plan)
    assert best[1] is not None
    return best[0], best[1]


def test_enumerator_finds_the_listed_mixed_optimum() -> None:
    case = Case((("A100-40", 1, 1), ("A6000", 1, 1)), 1, 16, 2048, 100e9)
    listed_s, listed = _listed_minimum(case)
    # The instance has a mixed optimum: both types, the faster one taking the larger share.
    assert len(listed.replicas) == 2, describe(listed)
    shares = {r.stages[0].device_type: r.batch_size for r in listed.replicas}
    assert shares["A100-40"] > shares["A6000"] >= 1

    cluster = case.cluster()
    model = small_model(case.blocks, case.hidden_size)
    training = TrainingSpec(global_batch_size=16, microbatch_sizes=[1, 2, 4])
    found_s, found, (seen, costed) = optimum(
        cluster, CostTables.for_cluster(model, training, cluster), training
    )
    assert found is not None
    assert math.isclose(found_s, listed_s, rel_tol=1e-9), (describe(found), describe(listed))
    assert {s.device_type for r in found.replicas for s in r.stages} == {"A100-40", "A6000"}
    assert costed <= seen * len(case.microbatch_sizes)

"""Sharding over the devices of one type: tp-1 replicas of the fastest type, optimizer state
sharded across them, beat a tp-4 replica there and every plan that adds the slower types.

The quality benchmark's ``a100+v100`` case (bench/planner_quality.py): four A100-40s and four
V100-16s on one node each, a 2-block GPT (hidden 2048, bf16), global batch 16. The best
unsharded plan is one tp-4 A100 replica (it pays four tensor-parallel all-reduces a pass);
four tp-1 A100 replicas unsharded each step the optimizer over the whole state; sharded at
``optimizer`` each steps a quarter (plus the gather of the updated slices), which is the
enumerated optimum. The V100s (no bf16 units, 100 Gb/s away) stay idle, so a sharded
candidate over every device cannot reach it.
"""

from __future__ import annotations

import pytest

from bench.planner_quality import CASES, optimum, small_model
from orchestrator.costmodel import CostTables
from orchestrator.planner import make_plan, sharded
from orchestrator.planner.selection import SearchConfig
from orchestrator.spec import TrainingSpec
from orchestrator.spec.plan import Sharding


def _case():
    case = CASES["a100+v100"]
    model = small_model(case.blocks, case.hidden_size)
    training = TrainingSpec(
        global_batch_size=case.global_batch, microbatch_sizes=list(case.microbatch_sizes)
    )
    return case.cluster(), model, training


def _is_four_sharded_a100_replicas(plan) -> bool:
    layers = plan.num_layers
    return len(plan.replicas) == 4 and all(
        [(s.device_type, s.tp, s.layers, s.sharding) for s in r.stages]
        == [("A100-40", 1, (0, layers), Sharding.OPTIMIZER)]
        for r in plan.replicas
    )


def test_tp1_replicas_of_the_fastest_type_sharded_are_chosen_and_are_the_optimum() -> None:
    cluster, model, training = _case()
    result = make_plan(cluster, model, training)
    assert _is_four_sharded_a100_replicas(result.plan), result.plan
    assert [r.batch_size for r in result.plan.replicas] == [4, 4, 4, 4]
    unsharded = make_plan(cluster, model, training, config=SearchConfig(sharded=False))
    assert {s.tp for r in unsharded.plan.replicas for s in r.stages} == {4}
    # Faster than the best unsharded plan by more than the 0.5% sharding must buy.
    assert result.estimate.step_time_s < unsharded.estimate.step_time_s * 0.99
    line = result.choices[0]
    assert line.startswith("sharding: optimizer over 4 devices (A100-40 only)"), line
    assert f"{unsharded.estimate.step_time_s * 1e3:.1f} ms for the best unsharded" in line
    # The enumerated optimum of the same cost model is that plan's step time.
    opt_s, _, _ = optimum(cluster, CostTables.for_cluster(model, training, cluster), training)
    assert result.estimate.step_time_s == pytest.approx(opt_s, rel=1e-9)


def test_the_one_type_candidate_beats_the_one_over_every_device() -> None:
    cluster, model, training = _case()
    tables = CostTables.for_cluster(model, training, cluster)
    sizes = list(training.microbatch_sizes)
    every = sharded.sharded_data_parallel(cluster, tables, training.global_batch_size, sizes)
    rates = {"A100-40": 2.0, "V100-16": 1.0}
    assert sharded.device_type_sets(rates) == [("A100-40", "V100-16"), ("A100-40",), ("V100-16",)]
    best = sharded.best_sharded_data_parallel(
        cluster, tables, training.global_batch_size, sizes, rates
    )
    assert every is not None and best is not None
    assert _is_four_sharded_a100_replicas(best[0])
    assert best[1].step_time_s < every[1].step_time_s


def test_sharded_variants_of_fitting_tp1_pipelines_reach_it_without_the_one_type_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the sharded data-parallel candidate spanning every device only, the selection that
    # offers the tp-1 shapes fitting unsharded in a sharded variant too finds the same plan.
    monkeypatch.setattr(sharded, "device_type_sets", lambda rates: [tuple(sorted(rates))])
    cluster, model, training = _case()
    result = make_plan(cluster, model, training)
    assert _is_four_sharded_a100_replicas(result.plan), result.plan
    assert "pipeline stages" in result.choices[0], result.choices


def test_the_elastic_search_keeps_the_unsharded_plan() -> None:
    # An unsharded plan fits, so the controller's planner keeps every layer whole on a rank.
    cluster, model, training = _case()
    elastic = make_plan(cluster, model, training, config=SearchConfig(sharded_only_if_needed=True))
    assert all(s.sharding is Sharding.NONE for r in elastic.plan.replicas for s in r.stages)

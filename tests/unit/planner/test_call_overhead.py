"""A stage's per-call cost: charged once per stage and microbatch, netted out of every profiled
layer (each was profiled as its own call); older profiles without it are summed as they are."""

from __future__ import annotations

import pytest

from orchestrator.costmodel import CostTables, estimate_plan
from orchestrator.costmodel.presets import MEGATRON_DEEPSPEED
from orchestrator.planner.partition import StageCosts, split_layers
from orchestrator.spec import Plan, ProfileSet
from orchestrator.spec.profiles import RuntimeConstants
from orchestrator.worker.call_terms import call_intercept, chain_lengths, fit_line

from .toy import cluster, model, profiles, training

LAYER_S = 0.01  # each layer: 0.01 s forward, 0.02 s backward, as profiled one by one
CALL_FORWARD_S, CALL_BACKWARD_S = 0.002, 0.003


def _with_calls(base: ProfileSet, forward_s: float | None, backward_s: float | None) -> ProfileSet:
    constants = RuntimeConstants(
        framework_bytes=0,
        state_bytes_per_param=16.0,
        optimizer="adam",
        microbatch_overhead_s=0.0,
        step_overhead_s=0.0,
        call_forward_s=forward_s,
        call_backward_s=backward_s,
    )
    return ProfileSet([f.model_copy(update={"runtime": constants}) for f in base.files])


def _pipeline(stage_layers: list[tuple[int, int]], microbatches: int) -> Plan:
    return Plan(
        global_batch_size=microbatches,
        microbatch_size=1,
        replicas=[
            {
                "batch_size": microbatches,
                "stages": [{"layers": list(r), "device_type": "A"} for r in stage_layers],
            }
        ],
    )


def test_the_call_cost_is_charged_once_per_stage_and_microbatch() -> None:
    m = model(4)
    n = m.num_planner_layers  # 6
    c, tr = cluster(("A", 1, 1)).resolve(), training(5)
    bare = profiles({"A": LAYER_S}, n)
    plan = _pipeline([(0, n)], 5)
    as_profiled = estimate_plan(plan, c, m, tr, bare).step_time_s
    assert as_profiled == pytest.approx(5 * n * 3 * LAYER_S)
    with_calls = estimate_plan(plan, c, m, tr, _with_calls(bare, CALL_FORWARD_S, CALL_BACKWARD_S))
    # One stage of n layers, five microbatches: each layer net of its call share, the call once.
    call_s = CALL_FORWARD_S + CALL_BACKWARD_S
    expected = 5 * (n * (3 * LAYER_S - call_s) + call_s)
    assert with_calls.step_time_s == pytest.approx(expected)
    # Dropping the term (charging every layer's call) or charging it per layer changes the step.
    assert with_calls.step_time_s < as_profiled - 5 * (n - 2) * call_s


def test_every_stage_of_a_pipeline_pays_its_own_calls() -> None:
    m = model(4)
    n = m.num_planner_layers
    c, tr = cluster(("A", 2, 1)).resolve(), training(4)
    base = profiles({"A": LAYER_S}, n)
    calls = _with_calls(base, CALL_FORWARD_S, CALL_BACKWARD_S)
    one = estimate_plan(_pipeline([(0, n)], 4), c, m, tr, calls)
    two = estimate_plan(_pipeline([(0, 3), (3, n)], 4), c, m, tr, calls)
    call_s = CALL_FORWARD_S + CALL_BACKWARD_S
    per_stage = [d.microbatch_s for d in two.devices]
    assert per_stage == pytest.approx([3 * (3 * LAYER_S - call_s) + call_s] * 2)
    assert one.devices[0].microbatch_s == pytest.approx(n * (3 * LAYER_S - call_s) + call_s)


def test_profiles_without_the_call_terms_and_other_runtimes_sum_layers_as_profiled() -> None:
    m = model(2)
    n = m.num_planner_layers
    c, tr = cluster(("A", 1, 1)).resolve(), training(2)
    base = profiles({"A": LAYER_S}, n)
    for older in (_with_calls(base, None, None), base):
        tables = CostTables.for_cluster(m, tr, c, older)
        assert tables.call_overhead_s("A") is None
        assert tables.table("A", 1, 1).compute_s(0, n) == pytest.approx(n * 3 * LAYER_S)
    # Megatron-DeepSpeed's preset reads none of our runtime's measured terms.
    theirs = CostTables.for_cluster(
        m, tr, c, _with_calls(base, CALL_FORWARD_S, CALL_BACKWARD_S), runtime=MEGATRON_DEEPSPEED
    )
    assert theirs.call_overhead_s("A") is None


def test_the_split_counts_the_call_cost_once_per_stage() -> None:
    # Net layer seconds 0.02 each (0.03 profiled, 0.01 of it the call): 6 layers in two stages.
    m = model(4)
    n = m.num_planner_layers
    c, tr = cluster(("A", 2, 1)).resolve(), training(2)
    calls = _with_calls(profiles({"A": LAYER_S}, n), 0.004, 0.006)
    table = CostTables.for_cluster(m, tr, c, calls).table("A", 1, 1)
    assert table.compute_s(0, 3) == pytest.approx(3 * 0.02 + 0.01)
    stage = StageCosts(table=table, comm_s=0.0, in_flight=1, memory_cap_bytes=float("inf"))
    split = split_layers([stage, stage], n)
    assert split is not None
    assert split.boundaries == (0, 3, n)
    assert split.bottleneck_s == pytest.approx(3 * 0.02 + 0.01)


def test_the_fit_separates_the_call_from_the_layers() -> None:
    points = [(k, 0.5 + 2.0 * k) for k in chain_lengths(8)]
    assert chain_lengths(8) == (1, 2, 4, 8)
    assert chain_lengths(6) == (1, 2, 4, 6)
    intercept, slope = fit_line(points)
    assert intercept == pytest.approx(0.5) and slope == pytest.approx(2.0)
    with pytest.raises(ValueError):
        fit_line([(1, 1.0), (1, 2.0)])


def test_only_an_intercept_out_of_the_scatter_counts_as_a_call_cost() -> None:
    exact = [(k, 0.5 + 2.0 * k) for k in (1, 2, 4, 8)]
    assert call_intercept(exact) == pytest.approx(0.5)
    # The same line with a scatter of +-0.5 at its points: the intercept is not told apart.
    noisy = [(1, 3.0), (2, 4.0), (4, 8.5), (8, 16.5)]
    assert call_intercept(noisy) == 0.0
    # A long chain slower per layer than a short one (negative intercept): no per-call cost.
    assert call_intercept([(k, -0.5 + 2.0 * k) for k in (1, 2, 4, 8)]) == 0.0

"""Our runtime's fixed time terms: the profiler's per-microbatch, per-step and round-trip seconds
reach the step time, and the overlapped all-reduce is exposed bucket by bucket."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.costmodel import CostTables, estimate_plan, estimate_with_tables
from orchestrator.costmodel.presets import MEGATRON_DEEPSPEED, ORCHESTRATOR
from orchestrator.spec import Plan, ProfileFile, ProfileSet
from orchestrator.spec.profiles import RuntimeConstants

from .toy import cluster, model, profiles, training

MICROBATCH_S, STEP_S, ROUND_TRIP_S = 0.003, 0.02, 0.005


def _with_terms(base: ProfileSet, **terms: float | None) -> ProfileSet:
    constants = RuntimeConstants(
        framework_bytes=0, state_bytes_per_param=16.0, optimizer="adam", **terms
    )
    return ProfileSet([f.model_copy(update={"runtime": constants}) for f in base.files])


def _one_stage(batch: int, num_layers: int, replicas: int = 1) -> Plan:
    return Plan(
        global_batch_size=batch,
        microbatch_size=1,
        replicas=[
            {
                "batch_size": batch // replicas,
                "stages": [{"layers": [0, num_layers], "device_type": "A"}],
            }
            for _ in range(replicas)
        ],
    )


def test_each_measured_term_adds_its_seconds_to_the_step() -> None:
    m = model(2)
    n = m.num_planner_layers
    c, tr = cluster(("A", 1, 1)).resolve(), training(6)
    bare = profiles({"A": 0.01}, n)
    plan = _one_stage(6, n)
    base = estimate_plan(plan, c, m, tr, bare).step_time_s
    full = _with_terms(
        bare,
        microbatch_overhead_s=MICROBATCH_S,
        step_overhead_s=STEP_S,
        round_trip_s=ROUND_TRIP_S,
    )
    # Six microbatches through one stage: the per-microbatch term six times, the others once.
    expected = base + 6 * MICROBATCH_S + STEP_S + ROUND_TRIP_S
    assert estimate_plan(plan, c, m, tr, full).step_time_s == pytest.approx(expected)
    # Dropping any one term changes the step by exactly that term.
    no_round_trip = _with_terms(bare, microbatch_overhead_s=MICROBATCH_S, step_overhead_s=STEP_S)
    assert estimate_plan(plan, c, m, tr, no_round_trip).step_time_s == pytest.approx(
        expected - ROUND_TRIP_S
    )
    no_step = _with_terms(
        bare, microbatch_overhead_s=MICROBATCH_S, step_overhead_s=0.0, round_trip_s=ROUND_TRIP_S
    )
    assert estimate_plan(plan, c, m, tr, no_step).step_time_s == pytest.approx(expected - STEP_S)
    # Constants without time terms (an older profile) charge none.
    assert estimate_plan(plan, c, m, tr, _with_terms(bare)).step_time_s == pytest.approx(base)


def test_the_per_microbatch_term_is_paid_by_every_stage_in_the_pipeline() -> None:
    m = model(2)
    n = m.num_planner_layers
    c, tr = cluster(("A", 2, 1)).resolve(), training(4)
    plan = Plan(
        global_batch_size=4,
        microbatch_size=1,
        replicas=[
            {
                "batch_size": 4,
                "stages": [
                    {"layers": [0, 2], "device_type": "A"},
                    {"layers": [2, n], "device_type": "A"},
                ],
            }
        ],
    )
    bare = profiles({"A": 0.01}, n)
    base = estimate_plan(plan, c, m, tr, bare)
    with_mb = estimate_plan(
        plan, c, m, tr, _with_terms(bare, microbatch_overhead_s=MICROBATCH_S, step_overhead_s=0.0)
    )
    # (m - 1) x the slowest stage + every stage once: 3 + 2 = 5 microbatch terms.
    assert with_mb.pipeline_s - base.pipeline_s == pytest.approx(5 * MICROBATCH_S)


def test_the_step_pays_the_slowest_types_fixed_terms() -> None:
    m = model(2)
    n = m.num_planner_layers
    c, tr = cluster(("A", 1, 1), ("B", 1, 1)).resolve(), training(4)
    plan = Plan(
        global_batch_size=4,
        microbatch_size=1,
        replicas=[
            {"batch_size": 2, "stages": [{"layers": [0, n], "device_type": t}]} for t in ("A", "B")
        ],
    )
    bare = profiles({"A": 0.01, "B": 0.01}, n)
    terms = {"A": 0.01, "B": 0.05}
    with_terms = ProfileSet(
        [
            f.model_copy(
                update={
                    "runtime": RuntimeConstants(
                        framework_bytes=0,
                        state_bytes_per_param=16.0,
                        optimizer="adam",
                        microbatch_overhead_s=0.0,
                        step_overhead_s=terms[f.device_type],
                    )
                }
            )
            for f in bare.files
        ]
    )
    delta = (
        estimate_plan(plan, c, m, tr, with_terms).step_time_s
        - estimate_plan(plan, c, m, tr, bare).step_time_s
    )
    assert delta == pytest.approx(0.05)


def test_the_megatron_preset_keeps_its_fitted_terms_over_our_measured_ones() -> None:
    m = model(2)
    n = m.num_planner_layers
    c, tr = cluster(("A", 1, 1)).resolve(), training(4)
    measured = _with_terms(
        profiles({"A": 0.01}, n), microbatch_overhead_s=1.0, step_overhead_s=1.0, round_trip_s=1.0
    )
    tables = CostTables.for_cluster(m, tr, c, measured, runtime=MEGATRON_DEEPSPEED)
    assert tables.microbatch_overhead_s("A") == MEGATRON_DEEPSPEED.microbatch_overhead_s
    assert tables.step_overhead_s("A") == MEGATRON_DEEPSPEED.step_overhead_s
    ours = CostTables.for_cluster(m, tr, c, measured, runtime=ORCHESTRATOR)
    assert ours.microbatch_overhead_s("A") == 1.0 and ours.step_overhead_s("A") == 2.0


def test_gradients_that_fit_one_bucket_are_reduced_after_the_whole_backward() -> None:
    m = model(4)
    n = m.num_planner_layers
    # A slow network so the all-reduce is comparable with the backward.
    c = cluster(("A", 2, 1), inter_node_bandwidth_bytes_per_s=1e6).resolve()
    tr = training(4)
    plan = _one_stage(4, n, replicas=2)
    p = profiles({"A": 0.01}, n)
    one_bucket = estimate_plan(plan, c, m, tr, p).devices[0]
    assert one_bucket.allreduce_total_s > 0
    # The toy model's gradients are far below 25 MiB: nothing overlaps the backward.
    assert one_bucket.allreduce_s == pytest.approx(one_bucket.allreduce_total_s)
    # With one layer per bucket, the later layers' reductions hide under the earlier backward.
    per_layer = replace(ORCHESTRATOR, grad_bucket_bytes=1.0)
    tables = CostTables.for_cluster(m, tr, c, p, runtime=per_layer)
    split = estimate_with_tables(plan, c, tables).devices[0]
    assert split.allreduce_total_s == pytest.approx(one_bucket.allreduce_total_s)
    assert split.allreduce_s < 0.9 * split.allreduce_total_s


def test_a_bucket_waits_for_its_layers_and_for_the_bucket_before_it() -> None:
    from orchestrator.costmodel.estimate import _exposed_allreduce_s

    m = model(2)
    n = m.num_planner_layers  # embedding, 2 blocks, head: 4 layers
    c, tr = cluster(("A", 1, 1)).resolve(), training(1)
    table = CostTables.for_cluster(m, tr, c, profiles({"A": 0.01}, n)).table("A", 1, 1)
    # Backward 0.02 s per layer. Buckets of two layers: [3, 2] ready at 0.04 s, [1, 0] at 0.08 s.
    seconds, nbytes = [0.05, 0.05, 0.05, 0.05], [1.0, 1.0, 1.0, 1.0]
    exposed = _exposed_allreduce_s(seconds, table, 0, n, True, 2.0, nbytes)
    # First bucket: 0.04 + 0.10 = 0.14; second starts after it: 0.14 + 0.10 = 0.24; minus 0.08.
    assert exposed == pytest.approx(0.16)
    fast = [0.001] * 4
    # Fast reductions: only the last bucket's, after the whole backward.
    assert _exposed_allreduce_s(fast, table, 0, n, True, 2.0, nbytes) == pytest.approx(0.002)


def test_profile_files_round_trip_the_time_terms() -> None:
    f = profiles({"A": 0.01}, 3).files[0]
    constants = RuntimeConstants(
        framework_bytes=1,
        state_bytes_per_param=16.0,
        optimizer="adam",
        microbatch_overhead_s=MICROBATCH_S,
        step_overhead_s=STEP_S,
        round_trip_s=ROUND_TRIP_S,
    )
    text = f.model_copy(update={"runtime": constants}).to_json()
    assert ProfileFile.model_validate_json(text).runtime == constants

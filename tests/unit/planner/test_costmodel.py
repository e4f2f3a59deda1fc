"""Cost model arithmetic on literal plans."""

from __future__ import annotations

import pytest

from orchestrator.costmodel import CostTables, estimate_plan, fluid_bound, memory
from orchestrator.costmodel.comm import ring_allreduce_s
from orchestrator.costmodel.schedule import simulate
from orchestrator.spec import ModelSpec, Plan, TrainingSpec

from .toy import cluster, model, profiles, training


def _plan(batch: int, *replicas: tuple[int, list[tuple[int, int, str]]], mbs: int = 1) -> Plan:
    return Plan(
        global_batch_size=batch,
        microbatch_size=mbs,
        replicas=[
            {"batch_size": b, "stages": [{"layers": [s, e], "device_type": t} for s, e, t in st]}
            for b, st in replicas
        ],
    )


def test_one_f_one_b_pipeline_time() -> None:
    # 4 planner layers; fast: 1 s fwd + 2 s bwd per layer. Stage 0 holds 1 layer (3 s),
    # stage 1 holds 3 layers (9 s). m = 4 microbatches: (4 - 1) * 9 + (3 + 9) = 39 s.
    c = cluster(("fast", 1, 2)).resolve()
    est = estimate_plan(
        _plan(4, (4, [(0, 1, "fast"), (1, 4, "fast")])),
        c,
        model(2),
        training(4),
        profiles({"fast": 1.0}, 4),
    )
    assert est.pipeline_s == pytest.approx(39.0)
    assert est.step_time_s == pytest.approx(39.0, rel=1e-9)  # no all-reduce with one replica
    assert [d.compute_s for d in est.devices] == pytest.approx([12.0, 36.0])


def test_uneven_replicas_and_the_slowest_decides() -> None:
    # Replica 0 on fast (12 s per sample for 4 layers), replica 1 on slow (24 s).
    # Batch 3:1 -> 36 s and 24 s; the step waits for the slower: 36 s (+ ~0 all-reduce).
    c = cluster(("fast", 1, 1), ("slow", 1, 1)).resolve()
    est = estimate_plan(
        _plan(4, (3, [(0, 4, "fast")]), (1, [(0, 4, "slow")])),
        c,
        model(2),
        training(4),
        profiles({"fast": 1.0, "slow": 2.0}, 4),
    )
    assert est.pipeline_s == pytest.approx(36.0)
    assert est.step_time_s == pytest.approx(36.0, rel=1e-6)


def test_optimizer_time_adds_after_the_pipeline() -> None:
    # Single stage, 4 layers x 0.5 s update = 2 s after a 12 s pipeline (1 microbatch).
    c = cluster(("fast", 1, 1)).resolve()
    est = estimate_plan(
        _plan(1, (1, [(0, 4, "fast")])), c, model(2), training(1), profiles({"fast": 1.0}, 4, 0.5)
    )
    assert est.update_s == pytest.approx(2.0)
    assert est.step_time_s == pytest.approx(14.0)


def test_ring_allreduce_volume() -> None:
    # 2 (n - 1) / n * bytes / bandwidth: 4 ranks, 1 GB at 1 GB/s -> 1.5 s.
    assert ring_allreduce_s(1e9, 4, 1e9) == pytest.approx(1.5)
    assert ring_allreduce_s(1e9, 1, 1e9) == 0.0


def test_allreduce_runs_over_the_slowest_link() -> None:
    # Two single-device nodes, 1 GB/s between them; OPT-like layer gradients all-reduced by 2
    # ranks: time = 2 * (1/2) * bytes / 1e9 summed over layers = total gradient bytes / 1e9.
    c = cluster(("fast", 2, 1), inter_node_bandwidth_bytes_per_s=1e9).resolve()
    m = ModelSpec(
        name="toy",
        num_layers=2,
        hidden_size=64,
        num_heads=2,
        sequence_length=4,
        vocab_size=16,
        dtype="fp32",
    )
    t = TrainingSpec(global_batch_size=2, microbatch_sizes=[1], mixed_precision=False)
    est = estimate_plan(
        _plan(2, (1, [(0, 4, "fast")]), (1, [(0, 4, "fast")])), c, m, t, profiles({"fast": 0.0}, 4)
    )
    grad_bytes = m.total_params * 4  # fp32 gradients
    assert est.allreduce_s == pytest.approx(grad_bytes / 1e9)


def test_memory_counts_state_and_activations_in_flight() -> None:
    # Under 1F1B stage s of p holds min(p - s, m) microbatches; GPipe holds all m.
    assert memory.microbatches_in_flight(0, 4, 8, "1f1b") == 4
    assert memory.microbatches_in_flight(3, 4, 8, "1f1b") == 1
    assert memory.microbatches_in_flight(0, 4, 2, "1f1b") == 2
    assert memory.microbatches_in_flight(0, 4, 8, "gpipe") == 8
    # Mixed-precision Adam keeps 16 bytes per parameter (ZeRO paper's figure).
    m = model(2)
    assert memory.state_bytes(m, TrainingSpec(), 1, 1) == m.layer_params(1) * 16
    assert memory.state_bytes(m, TrainingSpec(), 1, 2) == m.layer_params(1) * 8


def test_first_stage_holds_the_most_activations() -> None:
    c = cluster(("fast", 1, 4)).resolve()
    plan = _plan(8, (8, [(0, 1, "fast"), (1, 2, "fast"), (2, 3, "fast"), (3, 4, "fast")]))
    est = estimate_plan(plan, c, model(2), training(8), profiles({"fast": 1.0}, 4))
    tables = CostTables.for_cluster(model(2), training(8), c, profiles({"fast": 1.0}, 4))
    t = tables.table("fast", 1, 1)
    # Stage 1 (a block) holds 3 microbatches, stage 2 (a block) holds 2.
    assert est.devices[1].memory_bytes == pytest.approx(
        t.state_bytes(1, 2) + 3 * t.activation_bytes(1, 2)
    )
    assert est.devices[2].memory_bytes == pytest.approx(
        t.state_bytes(2, 3) + 2 * t.activation_bytes(2, 3)
    )


def test_fluid_bound_sums_device_rates() -> None:
    # fast: 4 layers x 3 s = 12 s per sample; slow: 24 s. Rates 2/12 + 1/24 samples/s for
    # 2 fast + 1 slow = 5/24; 10 samples need >= 10 / (5/24) = 48 s.
    c = cluster(("fast", 1, 2), ("slow", 1, 1)).resolve()
    tables = CostTables.for_cluster(
        model(2), training(10), c, profiles({"fast": 1.0, "slow": 2.0}, 4)
    )
    bound = fluid_bound(tables, c.device_counts, {"fast": [1], "slow": [1]}, 10)
    assert bound.step_time_s == pytest.approx(48.0)


def test_schedule_simulation_matches_the_closed_form_bound() -> None:
    # The closed form (m - 1) max T + sum T never under-estimates the simulated 1F1B.
    fwd, bwd = [1.0, 2.0, 1.5], [2.0, 4.0, 3.0]
    for m in (1, 2, 5, 8):
        ops = simulate(fwd, bwd, m)
        closed = (m - 1) * 6.0 + 13.5
        assert max(o.end_s for o in ops) <= closed + 1e-9
        assert len(ops) == 2 * 3 * m
    # One stage, m microbatches: exactly m * (f + b).
    assert max(o.end_s for o in simulate([1.0], [2.0], 4)) == pytest.approx(12.0)

"""Activation recompute as a plan choice: the plan format, the cost model's terms, the planner."""

from __future__ import annotations

import json

import pytest

from orchestrator.costmodel import CostTables, comm, estimate_plan, memory
from orchestrator.errors import InfeasibleError
from orchestrator.planner import make_plan
from orchestrator.planner.selection import SearchConfig
from orchestrator.spec import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan

from .toy import GiB, cluster, profiles

NUM_BLOCKS = 4
N = NUM_BLOCKS + 2  # planner layers: embedding, blocks, head


def _plan(recompute: tuple[bool, bool], batch: int = 4) -> Plan:
    return Plan.model_validate(
        {
            "global_batch_size": batch,
            "microbatch_size": 1,
            "replicas": [
                {
                    "batch_size": batch,
                    "stages": [
                        {"layers": [0, 3], "device_type": "dev", "recompute": recompute[0]},
                        {"layers": [3, N], "device_type": "dev", "recompute": recompute[1]},
                    ],
                }
            ],
        }
    )


def _model() -> ModelSpec:
    return ModelSpec(
        name="toy",
        num_layers=NUM_BLOCKS,
        hidden_size=64,
        num_heads=4,
        sequence_length=32,
        vocab_size=16,
        dtype="fp32",
    )


def test_plan_json_leaves_recompute_out_when_off_and_round_trips_it() -> None:
    off = _plan((False, False))
    assert "recompute" not in off.to_json()
    on = _plan((True, False))
    data = json.loads(on.to_json())
    assert [s.get("recompute", False) for s in data["replicas"][0]["stages"]] == [True, False]
    assert Plan.model_validate_json(on.to_json()) == on


def test_cost_model_adds_the_recomputed_forward_and_keeps_block_inputs_only() -> None:
    m = _model()
    tr = TrainingSpec(global_batch_size=4, microbatch_sizes=[1])
    c = cluster(("dev", 1, 2)).resolve()
    seconds = 0.01  # per layer forward; backward 2x
    prof = profiles({"dev": seconds}, N)
    plain = estimate_plan(_plan((False, False)), c, m, tr, prof)
    rec = estimate_plan(_plan((True, False)), c, m, tr, prof)
    # Stage 0 holds the embedding and blocks 1, 2: two blocks recompute their forward.
    extra_s = rec.devices[0].microbatch_s - plain.devices[0].microbatch_s
    assert extra_s == pytest.approx(2 * seconds)
    assert rec.devices[1].microbatch_s == pytest.approx(plain.devices[1].microbatch_s)
    # Memory: 2 microbatches in flight on stage 0 (1F1B, 2 stages); each recomputed block keeps
    # only its input [b, s, h], plus one block's full activations while it is recomputed.
    full_block = memory.activation_bytes_per_microbatch(m, 1, 1, 1)
    boundary = comm.boundary_activation_bytes(m, 1)
    in_flight = 2
    want_drop = in_flight * 2 * (full_block - boundary) - full_block
    drop = plain.devices[0].memory_bytes - rec.devices[0].memory_bytes
    assert drop == pytest.approx(want_drop)
    assert rec.devices[0].recompute and not rec.devices[1].recompute
    assert rec.devices[1].memory_bytes == pytest.approx(plain.devices[1].memory_bytes)


def _tight_case(recompute_allowed: bool) -> tuple[ModelSpec, TrainingSpec, float, float]:
    """A model with large activations (sequence 2048) and its whole state and activations."""
    m = ModelSpec(
        name="mid",
        num_layers=6,
        hidden_size=1024,
        num_heads=16,
        sequence_length=2048,
        vocab_size=1000,
        dtype="bf16",
    )
    tr = TrainingSpec(
        global_batch_size=8,
        microbatch_sizes=[1],
        max_tensor_parallel=1,
        activation_recompute=recompute_allowed,
    )
    c = cluster(("dev", 1, 2), memory_gib={"dev": 1.0}).resolve()
    t = CostTables.for_cluster(m, tr, c).table("dev", 1, 1)
    n = m.num_planner_layers
    return m, tr, t.state_bytes(0, n) / GiB, t.activation_bytes(0, n) / GiB


def test_plan_fits_only_with_recompute_on_the_first_stage() -> None:
    # Per device 1.25 GiB: less than the whole state (1.19 GiB) plus one block recomputing, so
    # no device holds the model alone; a 2-stage pipeline fits only if stage 0, holding two
    # microbatches in flight under 1F1B, keeps just its blocks' inputs.
    m, tr_off, state_gib, _ = _tight_case(False)
    assert 1.1 < state_gib < 1.25
    c = cluster(("dev", 1, 2), memory_gib={"dev": 1.25}).resolve()
    with pytest.raises(InfeasibleError):
        make_plan(c, m, tr_off)
    _, tr_on, _, _ = _tight_case(True)
    # Unsharded: two whole replicas recomputing with their optimizer state sharded over the
    # pair would fit too, and be faster (tests/unit/planner/test_sharded_shapes.py).
    result = make_plan(c, m, tr_on, config=SearchConfig(sharded=False))
    stages = [s for r in result.plan.replicas for s in r.stages]
    assert result.estimate.fits
    assert len(stages) == 2  # one two-stage pipeline over both devices
    # Stage 0 holds two microbatches in flight under 1F1B: it recomputes, the last stage not.
    assert [s.recompute for s in stages] == [True, False]
    # The estimate agrees: without the recompute flag the same split does not fit.
    data = json.loads(result.plan.to_json())
    for replica in data["replicas"]:
        for stage in replica["stages"]:
            stage["recompute"] = False
    plain = Plan.model_validate(data)
    assert not estimate_plan(plain, c, m, tr_on).fits


def test_recompute_is_not_used_where_memory_does_not_force_it() -> None:
    m, tr, _, _ = _tight_case(True)
    c = cluster(("dev", 1, 2), memory_gib={"dev": 1000.0}).resolve()
    result = make_plan(c, m, tr)
    assert not any(s.recompute for r in result.plan.replicas for s in r.stages)

"""The measured per-message latency of a point-to-point transfer is charged once per boundary
transfer of each stage and microbatch, for our runtime only."""

from __future__ import annotations

import pytest

from orchestrator.costmodel import estimate_plan
from orchestrator.costmodel.presets import MEGATRON_DEEPSPEED
from orchestrator.spec import Plan, ProfileSet
from orchestrator.spec.profiles import RuntimeConstants

from .toy import cluster, model, profiles, training

LATENCY_S = 0.004


def _with_latency(base: ProfileSet, latency_s: float | None) -> ProfileSet:
    constants = RuntimeConstants(
        framework_bytes=0,
        state_bytes_per_param=16.0,
        optimizer="adam",
        microbatch_overhead_s=0.0,
        step_overhead_s=0.0,
        p2p_latency_s=latency_s,
    )
    return ProfileSet([f.model_copy(update={"runtime": constants}) for f in base.files])


def _stages(bounds: list[tuple[int, int]]) -> Plan:
    return Plan(
        global_batch_size=4,
        microbatch_size=1,
        replicas=[
            {
                "batch_size": 4,
                "stages": [{"layers": list(b), "device_type": "A"} for b in bounds],
            }
        ],
    )


def test_each_boundary_transfer_pays_the_latency_once() -> None:
    m = model(4)
    n = m.num_planner_layers
    c, tr = cluster(("A", 3, 1)).resolve(), training(4)
    base = profiles({"A": 0.01}, n)
    plan = _stages([(0, 2), (2, 4), (4, n)])
    without = estimate_plan(plan, c, m, tr, _with_latency(base, None))
    with_latency = estimate_plan(plan, c, m, tr, _with_latency(base, LATENCY_S))
    # First and last stage: one transfer each per microbatch; the middle one sends both ways.
    pairs = zip(with_latency.devices, without.devices, strict=True)
    added = [w.microbatch_s - o.microbatch_s for w, o in pairs]
    assert added == pytest.approx([LATENCY_S, 2 * LATENCY_S, LATENCY_S])
    # A single stage sends nothing.
    one = _stages([(0, n)])
    assert estimate_plan(one, c, m, tr, _with_latency(base, LATENCY_S)).step_time_s == (
        pytest.approx(estimate_plan(one, c, m, tr, base).step_time_s)
    )
    # Megatron-DeepSpeed's preset does not read our runtime's measured latency.
    theirs = estimate_plan(
        plan, c, m, tr, _with_latency(base, LATENCY_S), runtime=MEGATRON_DEEPSPEED
    )
    plain = estimate_plan(plan, c, m, tr, base, runtime=MEGATRON_DEEPSPEED)
    assert theirs.step_time_s == pytest.approx(plain.step_time_s)

"""The layer-by-layer sharded path is charged per collective at the profiler's measured gloo
cost (``costmodel/sharding.layerwise_collectives_s``, ``worker/collective_cost.py``): every
round a reduction per owner's piece of each layer and, under ``full``, two gathers. The
once-a-step path's gather of updated slices is charged at the measured gather, and the gradient
all-reduce at the measured all-reduce where the profile has one; without, as before."""

from __future__ import annotations

import pytest

from orchestrator.costmodel import estimate_plan, sharding
from orchestrator.spec import ProfileSet
from orchestrator.spec.plan import Plan, Sharding
from orchestrator.spec.profiles import RuntimeConstants
from orchestrator.worker.topology import shard_bounds

from .test_layerwise_sharded import MODEL, TRAINING
from .toy import cluster, profiles

LATENCY_S = 0.003
FAST = 1e15  # bytes per second: the bytes cost nothing, the latency is what remains


def _with_cost(
    base: ProfileSet,
    latency_s: float | None,
    bytes_per_s: float | None,
    reduce_factor: float = 1.0,
) -> ProfileSet:
    """Profiles whose runtime constants carry this gather cost, and the reduction's
    ``reduce_factor`` times slower (latency and bytes)."""
    constants = RuntimeConstants(
        framework_bytes=0,
        state_bytes_per_param=16.0,
        optimizer="adam",
        microbatch_overhead_s=0.0,
        step_overhead_s=0.0,
        gather_latency_s=latency_s,
        gather_bytes_per_s=bytes_per_s,
        reduce_latency_s=None if latency_s is None else latency_s * reduce_factor,
        reduce_bytes_per_s=None if bytes_per_s is None else bytes_per_s / reduce_factor,
    )
    return ProfileSet([f.model_copy(update={"runtime": constants}) for f in base.files])


def _plan(level: Sharding, shares: list[int], layers: int) -> Plan:
    """One whole-model replica per share, every stage at ``level``."""
    stage = {"layers": [0, layers], "device_type": "dev", "sharding": level.value}
    return Plan.model_validate(
        {
            "global_batch_size": sum(shares),
            "microbatch_size": 1,
            "replicas": [{"batch_size": b, "stages": [stage]} for b in shares],
        }
    )


def test_pieces_are_the_runtime_slices_that_meet_each_layer() -> None:
    numels = [MODEL.layer_params(i) for i in range(MODEL.num_planner_layers)]
    for k in (2, 3, 4):
        bounds = shard_bounds(sum(numels), k)
        start, want = 0, []
        for n in numels:
            end = start + n
            want.append(
                [min(hi, end) - max(lo, start) for lo, hi in bounds if lo < end and start < hi]
            )
            start = end
        assert sharding.layerwise_segments(numels, k) == want
        assert sum(map(sum, sharding.layerwise_segments(numels, k))) == sum(numels)


@pytest.mark.parametrize("level", [Sharding.FULL, Sharding.GRADIENTS])
def test_each_collective_pays_the_measured_latency(level: Sharding) -> None:
    n = MODEL.num_planner_layers
    c = cluster(("dev", 1, 4), memory_gib={"dev": 8.0}).resolve()
    base = profiles({"dev": 0.01}, n, update_s=0.0)
    shares = [3, 2, 2, 1]  # 3 rounds: the holders with fewer microbatches run empty ones
    plan = _plan(level, shares, n)
    assert sharding.runs_layer_by_layer(plan)
    free = estimate_plan(plan, c, MODEL, TRAINING, _with_cost(base, 0.0, FAST))
    # gloo's reduce costs several gathers among 3 or more ranks: each charged its own
    paid = estimate_plan(plan, c, MODEL, TRAINING, _with_cost(base, LATENCY_S, FAST, 3.0))
    numels = [MODEL.layer_params(i) for i in range(n)]
    pieces = sum(len(p) for p in sharding.layerwise_segments(numels, len(shares)))
    rounds = 3
    # full: gathers before the forward and the backward and a reduction, every round;
    # gradients: a reduction every round, and the updated slices gathered once
    full = level is Sharding.FULL
    gathers = rounds * 2 * pieces if full else len(shares)
    reduces = rounds * pieces
    want_s = (gathers + 3.0 * reduces) * LATENCY_S
    assert paid.step_time_s - free.step_time_s == pytest.approx(want_s, abs=1e-5)
    # The bytes at the measured rates: a slower rate costs more, by bytes / rate.
    slow = estimate_plan(plan, c, MODEL, TRAINING, _with_cost(base, 0.0, 1e9, 3.0))
    w = g = 4  # fp32
    total = sum(numels)
    gathered = rounds * total * 2 * w if full else total * w
    moved = gathered + 3.0 * rounds * total * g
    assert slow.step_time_s - free.step_time_s == pytest.approx(moved / 1e9, rel=1e-5)


def test_unsharded_plans_are_costed_as_before_without_an_allreduce_measurement() -> None:
    n = MODEL.num_planner_layers
    c = cluster(("dev", 1, 4), memory_gib={"dev": 8.0}).resolve()
    base = profiles({"dev": 0.01}, n, update_s=0.0)
    plain = _with_cost(base, None, None)
    measured = _with_cost(base, LATENCY_S, 1e9)
    plan = _plan(Sharding.NONE, [2, 2, 2, 2], n)
    want = estimate_plan(plan, c, MODEL, TRAINING, plain).step_time_s
    assert estimate_plan(plan, c, MODEL, TRAINING, measured).step_time_s == pytest.approx(want)


def test_the_once_a_step_gather_of_updated_slices_is_charged_at_the_measured_gather() -> None:
    """At ``optimizer`` our runtime all-reduces whole gradients and then broadcasts each
    holder's updated slice: ``k`` gathers a shard group, each paying the measured latency."""
    n = MODEL.num_planner_layers
    c = cluster(("dev", 1, 4), memory_gib={"dev": 8.0}).resolve()
    base = profiles({"dev": 0.01}, n, update_s=0.0)
    plan = _plan(Sharding.OPTIMIZER, [2, 2, 2, 2], n)
    assert not sharding.runs_layer_by_layer(plan)
    plain = estimate_plan(plan, c, MODEL, TRAINING, _with_cost(base, None, None))
    paid = estimate_plan(plan, c, MODEL, TRAINING, _with_cost(base, LATENCY_S, FAST))
    assert paid.step_time_s - plain.step_time_s == pytest.approx(4 * LATENCY_S, abs=1e-6)
    # A rate slower than the catalog's link: the weights' bytes at that rate.
    slow = estimate_plan(plan, c, MODEL, TRAINING, _with_cost(base, 0.0, 1e6))
    weights = sum(MODEL.layer_params(i) for i in range(n)) * 4
    assert slow.step_time_s - plain.step_time_s == pytest.approx(weights / 1e6, rel=0.05)


def _with_allreduce(base: ProfileSet, latency_s: float, bytes_per_s: float) -> ProfileSet:
    files = []
    for f in base.files:
        assert f.runtime is not None
        runtime = f.runtime.model_copy(
            update={"allreduce_latency_s": latency_s, "allreduce_bytes_per_s": bytes_per_s}
        )
        files.append(f.model_copy(update={"runtime": runtime}))
    return ProfileSet(files)


def test_the_gradient_allreduce_is_charged_at_no_less_than_the_measured_one() -> None:
    """Data parallel over four whole replicas: the model's gradients fit one bucket, reduced
    after the backward (nothing left to overlap with), so the measured latency is paid once
    and the bytes at the measured rate where it is slower than the catalog's link."""
    n = MODEL.num_planner_layers
    c = cluster(("dev", 1, 4), memory_gib={"dev": 8.0}).resolve()
    base = _with_cost(profiles({"dev": 0.01}, n, update_s=0.0), None, None)
    plan = _plan(Sharding.NONE, [2, 2, 2, 2], n)
    plain = estimate_plan(plan, c, MODEL, TRAINING, base)
    paid = estimate_plan(plan, c, MODEL, TRAINING, _with_allreduce(base, LATENCY_S, FAST))
    assert paid.step_time_s - plain.step_time_s == pytest.approx(LATENCY_S, abs=1e-7)
    slow = estimate_plan(plan, c, MODEL, TRAINING, _with_allreduce(base, 0.0, 1e6))
    grads = sum(MODEL.layer_params(i) for i in range(n)) * 4
    assert slow.step_time_s - plain.step_time_s == pytest.approx(grads / 1e6, rel=0.05)

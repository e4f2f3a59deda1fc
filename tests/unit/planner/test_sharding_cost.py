"""Sharded data parallel in the cost model, and the plan format's sharding and layout checks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.costmodel import estimate_plan
from orchestrator.costmodel.presets import ORCHESTRATOR, RuntimePreset
from orchestrator.costmodel.sharding import master_bytes, state_parts_bytes
from orchestrator.errors import SpecError
from orchestrator.spec import Plan

from .toy import cluster, model, profiles, training


def _plan(level: str, replicas: int = 3, tp: int = 1) -> Plan:
    return Plan(
        global_batch_size=replicas,
        microbatch_size=1,
        replicas=[
            {
                "batch_size": 1,
                "stages": [{"layers": [0, 4], "device_type": "fast", "sharding": level, "tp": tp}],
            }
            for _ in range(replicas)
        ],
    )


# Our state terms with FSDP's gathers: two layers whole at once, gathered before each forward
# and backward, gradients reduce-scattered during the backward.
FSDP_LIKE = replace(
    ORCHESTRATOR,
    name="fsdp-like",
    gathered_layers=2,
    blocks_sharded_reduction=False,
    whole_gradients_at_peak=False,
    layerwise_sharded_replicas=False,
)
# Our engine's once-a-step path (worker/sharding.py), which pipelined sharded layouts run; the
# whole-replica layout of these tests runs layer by layer (worker/layerwise.py) on our engine.
ONCE_A_STEP = replace(ORCHESTRATOR, name="once-a-step", layerwise_sharded_replicas=False)


def _estimate(plan: Plan, bandwidth: float = 1e30, runtime: RuntimePreset = FSDP_LIKE):
    c = cluster(("fast", 3, 1), inter_node_bandwidth_bytes_per_s=bandwidth).resolve()
    return estimate_plan(
        plan,
        c,
        model(2),
        training(plan.global_batch_size),
        profiles({"fast": 1.0}, 4),
        runtime=runtime,
    )


@pytest.mark.parametrize(
    ("level", "kept"),
    [
        # (weights, gradients, optimizer) fractions kept on each of 3 holders
        ("optimizer", (1, 1, 1 / 3)),
        ("gradients", (1, 1 / 3, 1 / 3)),
    ],
)
def test_memory_divides_what_the_level_shards(level: str, kept: tuple[float, ...]) -> None:
    m, t = model(2), training(3)
    parts = [state_parts_bytes(m, t, i, 1) for i in range(4)]
    whole = _estimate(_plan("none")).devices[0].memory_bytes
    sharded = _estimate(_plan(level)).devices[0].memory_bytes
    # fp32 training: a sharded holder also steps an fp32 copy of its third of the weights
    master = sum(master_bytes(m, t, i, 1) for i in range(4))
    assert master > 0
    saved = sum(p[j] * (1 - kept[j]) for p in parts for j in range(3)) - master / 3
    assert saved > 0
    assert whole - sharded == pytest.approx(saved, rel=1e-9)


def test_full_sharding_holds_a_third_plus_two_gathered_layers() -> None:
    m, t = model(2), training(3)
    parts = [state_parts_bytes(m, t, i, 1) for i in range(4)]
    whole = _estimate(_plan("none")).devices[0].memory_bytes
    full = _estimate(_plan("full")).devices[0].memory_bytes
    total = sum(sum(p) for p in parts)
    gathered = sum(sorted((p[0] for p in parts), reverse=True)[:2])
    master = sum(master_bytes(m, t, i, 1) for i in range(4))
    assert whole - full == pytest.approx(total * 2 / 3 - gathered - master / 3, rel=1e-9)


def test_full_sharding_gathers_hide_behind_compute_until_the_link_is_slow() -> None:
    fast_link = _estimate(_plan("full"), bandwidth=1e30)
    plain_fast = _estimate(_plan("none"), bandwidth=1e30)
    assert fast_link.step_time_s == pytest.approx(plain_fast.step_time_s, rel=1e-6)
    # A link so slow that two weight gathers take far longer than the 12 s of compute: the
    # part that does not hide shows in the step.
    slow = 1e-2
    full = _estimate(_plan("full"), bandwidth=slow)
    plain = _estimate(_plan("none"), bandwidth=slow)
    m, t = model(2), training(3)
    weights = sum(state_parts_bytes(m, t, i, 1)[0] for i in range(4))
    gathers = 2 * (2 / 3) * weights / slow
    saved_gather = (2 / 3) * weights / slow  # no gather of updated weights at ZeRO-3
    compute = full.devices[0].compute_s
    assert gathers > compute
    assert full.step_time_s - plain.step_time_s == pytest.approx(
        gathers - compute - saved_gather, rel=1e-6
    )


def test_our_full_sharding_holds_the_stage_whole_and_moves_what_zero2_moves() -> None:
    """Our engine gathers a step's parameters once (worker/sharding.py): during the step every
    layer's weights are whole, and so are its gradients until the backward ends (they are
    reduced to slices after it); only the optimizer state is a third at the peak; traffic is
    ZeRO-2's."""
    m, t = model(2), training(3)
    parts = [state_parts_bytes(m, t, i, 1) for i in range(4)]
    whole = _estimate(_plan("none"), runtime=ONCE_A_STEP).devices[0].memory_bytes
    full = _estimate(_plan("full"), runtime=ONCE_A_STEP).devices[0].memory_bytes
    total = sum(sum(p) for p in parts)
    weights = sum(p[0] for p in parts)
    grads = sum(p[1] for p in parts)
    master = sum(master_bytes(m, t, i, 1) for i in range(4))
    saved = total * 2 / 3 - weights - grads * 2 / 3 - master / 3
    assert whole - full == pytest.approx(saved, rel=1e-9)
    for bandwidth in (1e30, 1e-2):
        ours = _estimate(_plan("full"), bandwidth, ONCE_A_STEP).step_time_s
        zero2 = _estimate(_plan("gradients"), bandwidth, ONCE_A_STEP).step_time_s
        assert ours == pytest.approx(zero2, rel=1e-9)
    # and never less memory than ZeRO-2 on our engine (the slices add to whole weights)
    zero2_memory = _estimate(_plan("gradients"), runtime=ONCE_A_STEP).devices[0].memory_bytes
    assert full >= zero2_memory


def test_unsharded_plans_keep_their_json_and_sharding_round_trips() -> None:
    assert "sharding" not in _plan("none").to_json()
    plan = _plan("gradients")
    assert Plan.model_validate_json(plan.to_json()) == plan


def test_layout_checks_name_the_field() -> None:
    with pytest.raises(SpecError, match=r"tp=3 does not divide num_heads \(2\)"):
        _plan("none", tp=3).check_layouts(2, 32, {"fast": 4})
    with pytest.raises(SpecError, match="largest such node has 1"):
        _plan("none", tp=2).check_layouts(2, 32, {"fast": 1})
    mixed = Plan(
        global_batch_size=2,
        microbatch_size=1,
        replicas=[
            {"batch_size": 1, "stages": [{"layers": [0, 4], "device_type": "fast", "sharding": s}]}
            for s in ("optimizer", "gradients")
        ],
    )
    with pytest.raises(SpecError, match="different levels"):
        mixed.check_layouts(2, 32, {"fast": 1})


def test_sharded_holders_update_their_slice_only() -> None:
    c = cluster(("fast", 3, 1)).resolve()
    costs = [
        estimate_plan(_plan(level), c, model(2), training(3), profiles({"fast": 1.0}, 4, 0.5))
        for level in ("none", "gradients")
    ]
    assert costs[0].update_s == pytest.approx(2.0)  # 4 layers x 0.5 s
    assert costs[1].update_s == pytest.approx(2.0 / 3)


def test_our_engine_reduces_fully_sharded_gradients_after_the_backward() -> None:
    # a group whose holders all shard gradients reduces slice by slice after the backward
    # (worker/topology.overlaps_grad_reduce): none of its all-reduce hides; ZeRO-1 still overlaps
    zero2 = _estimate(_plan("gradients"), bandwidth=1e3, runtime=ORCHESTRATOR).devices[0]
    assert zero2.allreduce_total_s > 0
    assert zero2.allreduce_s >= zero2.allreduce_total_s
    zero1 = _estimate(_plan("optimizer"), bandwidth=1e3, runtime=ORCHESTRATOR).devices[0]
    plain = _estimate(_plan("none"), bandwidth=1e3, runtime=ORCHESTRATOR).devices[0]
    assert plain.allreduce_s < plain.allreduce_total_s  # the unsharded all-reduce partly hides
    assert zero1.allreduce_total_s == pytest.approx(plain.allreduce_total_s)


def test_on_our_engine_sharding_gradients_saves_no_peak_memory_over_the_optimizer_level() -> None:
    # worker/sharding.after_backward reduces gradients to slices only after the backward, so at
    # the step's peak every holder holds them whole: the cost model must not count them / k.
    def memory(level: str, runtime: RuntimePreset) -> float:
        return _estimate(_plan(level), runtime=runtime).devices[0].memory_bytes

    assert memory("gradients", ONCE_A_STEP) == pytest.approx(memory("optimizer", ONCE_A_STEP))
    assert memory("gradients", FSDP_LIKE) < memory("optimizer", FSDP_LIKE)
    # layer by layer (every holder a whole one-stage replica) only one layer's gradients stay
    # whole beside the slice
    assert memory("gradients", ORCHESTRATOR) < memory("optimizer", ORCHESTRATOR)


def test_layer_by_layer_holds_a_third_plus_one_layer_and_pays_each_rounds_collectives() -> None:
    """Our engine runs whole-replica sharding at ``gradients``/``full`` layer by layer
    (worker/layerwise.py): a holder keeps a third of the state, one layer's whole gradients and
    under ``full`` one layer's whole weights (its weight slice is the fp32 master slice); each
    microbatch round gathers every layer twice and reduces its gradient, none of it hidden."""
    m, t = model(2), training(3)
    parts = [state_parts_bytes(m, t, i, 1) for i in range(4)]
    master = sum(master_bytes(m, t, i, 1) for i in range(4))
    weights = [p[0] for p in parts]
    grads = [p[1] for p in parts]
    opt = sum(p[2] for p in parts)
    whole = _estimate(_plan("none"), runtime=ORCHESTRATOR).devices[0].memory_bytes
    for level, held_weights in (("gradients", sum(weights)), ("full", max(weights))):
        memory = _estimate(_plan(level), runtime=ORCHESTRATOR).devices[0].memory_bytes
        held = held_weights + sum(grads) / 3 + max(grads) + (opt + master) / 3
        total = sum(weights) + sum(grads) + opt
        assert whole - memory == pytest.approx(total - held, rel=1e-9), level
    # one round a step here (a batch of 1 a replica); the extra traffic beyond the all-reduce
    slow = 1e3
    plain = _estimate(_plan("none"), slow, ORCHESTRATOR).devices[0]
    full = _estimate(_plan("full"), slow, ORCHESTRATOR).devices[0]
    moved = sum(2 / 3 * (2 * w + g) for w, g in zip(weights, grads, strict=True))
    assert full.allreduce_s == pytest.approx(
        plain.allreduce_total_s + moved / slow - (sum(2 * 2 / 3 * g for g in grads) / slow)
    )


def test_our_optimizer_sharding_pays_the_gather_on_top_of_the_all_reduce() -> None:
    # worker/sharding.py: at ``optimizer`` every holder all-reduces whole gradients, then the
    # holders gather the updated slices; only ``gradients`` reduces slice by slice. So the
    # gather, (k - 1) / k of the weights over the link, adds to plain data parallel's traffic.
    bandwidth = 1e3
    reduce_scatter = replace(ORCHESTRATOR, optimizer_sharding_all_reduces=False)
    zero1 = _estimate(_plan("optimizer"), bandwidth, ORCHESTRATOR).devices[0]
    plain = _estimate(_plan("none"), bandwidth, ORCHESTRATOR).devices[0]
    zero1_rs = _estimate(_plan("optimizer"), bandwidth, reduce_scatter).devices[0]
    m, t = model(2), training(3)
    gather_s = sum(2 / 3 * state_parts_bytes(m, t, i, 1)[0] / bandwidth for i in range(4))
    assert gather_s > 0
    assert zero1.allreduce_s == pytest.approx(plain.allreduce_s + gather_s)
    # reduce-scatter + all-gather move what the all-reduce moves (fp32: weights = gradients)
    assert zero1_rs.allreduce_s == pytest.approx(plain.allreduce_s)

"""The goodput simulation: traces, the timed planner's renaming, the cost model's byte counts,
the real controller on the simulated world, and the checkpoint-restart baseline."""

from __future__ import annotations

import math

import pytest
from control_fakes import NUM_LAYERS, FakePlanner

from orchestrator.control.planning import MakePlanPlanner
from orchestrator.control.recovery import RestoreKind
from orchestrator.sim.costs import CostModel, RestoreRead, StateMove
from orchestrator.sim.planner import TimedPlanner
from orchestrator.sim.restart import RestartModel, simulate_restart
from orchestrator.sim.run import Scenario, goodput, simulate
from orchestrator.sim.trace import (
    FailureTrace,
    empty_trace,
    llama3_rate_per_gpu_s,
    poisson_trace,
)
from orchestrator.spec import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, ReplicaSpec, StageSpec
from orchestrator.spec.snapshot import ClusterSnapshot, NodeInfo

GB = 1e9


def test_llama3_rate_gives_419_interruptions_in_54_days_on_16384_gpus():
    expected = llama3_rate_per_gpu_s() * 16_384 * 54 * 86_400
    assert expected == pytest.approx(419)
    assert llama3_rate_per_gpu_s(10.0) == pytest.approx(10 * llama3_rate_per_gpu_s())


def test_poisson_trace_is_seeded_and_has_the_rate():
    a = poisson_trace(1 / 100, 1_000_000, seed=3)
    assert a == poisson_trace(1 / 100, 1_000_000, seed=3)
    assert a != poisson_trace(1 / 100, 1_000_000, seed=4)
    assert list(a.times_s) == sorted(a.times_s) and a.times_s[-1] < 1_000_000
    assert len(a.times_s) == pytest.approx(a.expected_failures, rel=0.1)  # 10,000 expected


# -- the timed planner -------------------------------------------------------------------------


def _nodes(names_and_types):
    return [NodeInfo(name, device_type, 8) for name, device_type in names_and_types]


def test_a_repeated_shape_gets_the_plan_the_planner_would_choose_with_the_new_names():
    model = ModelSpec(
        name="small",
        num_layers=8,
        hidden_size=1024,
        num_heads=16,
        sequence_length=512,
        vocab_size=1000,
        dtype="bf16",
    )
    real = MakePlanPlanner(model, TrainingSpec(global_batch_size=64, microbatch_sizes=[1, 2]))
    charged = []
    timed = TimedPlanner(real, charged.append)
    before = ClusterSnapshot.of(1, _nodes([("a0", "H100"), ("a1", "H100"), ("b0", "A100-80")]))
    first = timed(before, {})
    # a1 replaced by z9 (a new id that sorts elsewhere): the same shape.
    after = ClusterSnapshot.of(2, _nodes([("a0", "H100"), ("z9", "H100"), ("b0", "A100-80")]))
    again = timed(after, {})
    assert [fresh for _, _, fresh in timed.calls] == [True, False]
    assert charged[1] == charged[0] > 0  # a repeat costs what the real call cost
    fresh = real(after, {})
    assert again.plan == fresh.plan
    assert again.predicted_step_s == pytest.approx(fresh.predicted_step_s)
    assert "a1" not in {s.node for r in again.plan.replicas for s in r.stages}
    assert "a1" in {s.node for r in first.plan.replicas for s in r.stages}
    # A different shape (one node fewer) is planned afresh.
    timed(ClusterSnapshot.of(3, _nodes([("a0", "H100"), ("b0", "A100-80")])), {})
    assert timed.calls[-1][2] is True


# -- the cost model ------------------------------------------------------------------------------


def _plan(*replicas: list[tuple[int, int, str]]) -> Plan:
    return Plan(
        global_batch_size=4 * len(replicas),
        microbatch_size=1,
        replicas=tuple(
            ReplicaSpec(
                batch_size=4,
                stages=tuple(StageSpec(layers=(a, b), device_type="H100", node=n) for a, b, n in r),
            )
            for r in replicas
        ),
    )


def test_keeping_survivors_moves_only_the_layers_that_changed_owner():
    costs = CostModel((1 * GB, 2 * GB, 3 * GB, 4 * GB), move=StateMove.THROUGH_CONTROLLER)
    old = _plan([(0, 2, "n1"), (2, 4, "n2")], [(0, 2, "n3"), (2, 4, "n4")])
    # n4 lost: n3 now holds the whole second replica, gaining layers 2 and 3 (7 GB).
    new = _plan([(0, 2, "n1"), (2, 4, "n2")], [(0, 4, "n3")])
    assert costs.bytes_new_by_node(old, new) == {"n1": 0, "n2": 0, "n3": 7 * GB}
    survivors = CostModel(costs.layer_state_bytes, move=StateMove.KEEP_SURVIVORS, reform_s=2.0)
    seconds, moved = survivors.launch_s(old, new, RestoreKind.REPLICAS)
    assert moved == 7 * GB
    assert seconds == pytest.approx(2.0 + 7 * GB / survivors.link_bytes_per_s)
    # Through the controller every copy of every layer is sent again: 2 replicas x 10 GB.
    seconds, moved = costs.launch_s(old, new, RestoreKind.REPLICAS)
    assert moved == 20 * GB
    assert seconds == pytest.approx(costs.group_start_s + 20 * GB / costs.link_bytes_per_s)
    # A fresh start moves nothing; the same plan again moves nothing either.
    assert costs.launch_s(None, new, RestoreKind.FRESH)[1] == 0
    assert survivors.launch_s(new, new, RestoreKind.REPLICAS) == (2.0, 0)
    # The first group is started from scratch either way.
    assert survivors.launch_s(None, new, RestoreKind.FRESH) == (survivors.group_start_s, 0)


def test_a_checkpoint_restore_is_read_by_the_holders_in_parallel():
    sizes = (1 * GB, 2 * GB, 3 * GB, 4 * GB)
    old = _plan([(0, 2, "n1"), (2, 4, "n2")], [(0, 2, "n3"), (2, 4, "n4")])
    new = _plan([(0, 2, "n1"), (2, 4, "n2")], [(0, 4, "n3")])
    holders = CostModel(sizes, reform_s=2.0, storage_bytes_per_s=1e12)
    # Each rank reads its own layers' files: n1 3 GB, n2 7 GB, n3 10 GB, all at once; the
    # busiest node's link bounds it (storage fast here).
    assert holders.read_bytes_by_node(new) == {"n1": 3 * GB, "n2": 7 * GB, "n3": 10 * GB}
    seconds, moved = holders.launch_s(old, new, RestoreKind.CHECKPOINT)
    assert moved == 20 * GB
    assert seconds == pytest.approx(2.0 + 10 * GB / holders.link_bytes_per_s)
    # Storage slower than the links: its aggregate bandwidth bounds the 20 GB read.
    slow = CostModel(sizes, reform_s=2.0, storage_bytes_per_s=1 * GB)
    assert slow.launch_s(old, new, RestoreKind.CHECKPOINT)[0] == pytest.approx(2.0 + 20.0)
    # A tensor-parallel stage's files are read once (by its first rank) for all its ranks.
    tp = Plan(
        global_batch_size=4,
        microbatch_size=1,
        replicas=(
            ReplicaSpec(
                batch_size=4,
                stages=(StageSpec(layers=(0, 4), device_type="H100", node="n1", tp=2),),
            ),
        ),
    )
    assert holders.read_bytes_by_node(tp) == {"n1": 10 * GB}
    # Through the controller (the model before): read once at min(link, storage), then every
    # copy of every layer sent through its link.
    via = CostModel(
        sizes, reform_s=2.0, storage_bytes_per_s=1e12, restore_read=RestoreRead.CONTROLLER
    )
    seconds, moved = via.launch_s(old, new, RestoreKind.CHECKPOINT)
    assert moved == 20 * GB
    assert seconds == pytest.approx(2.0 + (10 + 20) * GB / via.link_bytes_per_s)


def test_holders_write_checkpoints_bounded_by_the_busiest_writer_node():
    costs = CostModel((1 * GB, 2 * GB, 3 * GB, 4 * GB), storage_bytes_per_s=1e12)
    plan = _plan([(0, 2, "n1"), (2, 4, "n2")], [(0, 4, "n3")])
    # Each layer is written once, by its holder in the lowest replica: n3 writes nothing.
    by_node = costs.writer_bytes_by_node(plan)
    assert by_node == {"n1": 3 * GB, "n2": 7 * GB, "n3": 0}
    assert costs.checkpoint_write_s(by_node) == pytest.approx(7 * GB / costs.link_bytes_per_s)
    # Storage slower than the links: the aggregate bandwidth bounds it.
    slow = CostModel(costs.layer_state_bytes, storage_bytes_per_s=1 * GB)
    assert slow.checkpoint_write_s(by_node) == pytest.approx(10.0)


def test_model_state_bytes_are_parameters_and_optimizer_state():
    model = ModelSpec(
        name="m",
        num_layers=2,
        hidden_size=256,
        num_heads=4,
        sequence_length=64,
        vocab_size=100,
        dtype="bf16",
    )
    training = TrainingSpec(global_batch_size=8)
    costs = CostModel.for_model(model, training)
    per_param = training.state_bytes_per_param(model.dtype) - training.grad_bytes_per_param(
        model.dtype
    )
    assert costs.model_state_bytes == model.total_params * per_param


# -- the controller on the simulated world ------------------------------------------------------

FOUR_NODES = tuple(NodeInfo(f"n{i}", "A100-80", 2) for i in range(4))
COSTS = CostModel(layer_state_bytes=(1 * GB,) * NUM_LAYERS)


def _run(trace, *, costs=COSTS, nodes=FOUR_NODES, planner=None, interval=10):
    scenario = Scenario(
        nodes, trace, costs, replace_after_s=120.0, checkpoint_interval_steps=interval
    )
    return simulate(scenario, planner or FakePlanner())


def test_failures_recover_from_replicas_without_lost_steps_and_cost_goodput():
    reference = _run(empty_trace(3_600))
    assert reference.failures == 0 and reference.recovery_s == []
    assert goodput(reference, reference) == 1.0
    trace = FailureTrace((600.0, 1_800.0), 3_600, 0.0, seed=1)
    run = _run(trace)
    assert run.interruptions == 2 and run.failures == 2
    assert run.lost_steps == 0  # every layer has a surviving data-parallel copy
    assert len(run.recovery_s) == 2
    # Failure seen -> first step: the re-formation, then a step (no group started afresh).
    assert all(COSTS.reform_s < r < COSTS.group_start_s for r in run.recovery_s)
    assert run.switches == 2  # each replacement joined and the switch rule took it
    assert 0.9 < goodput(run, reference) < 1.0


def test_keeping_survivors_recovers_faster_and_moves_fewer_bytes():
    trace = FailureTrace((600.0,), 3_600, 0.0, seed=1)
    old = CostModel(COSTS.layer_state_bytes, move=StateMove.THROUGH_CONTROLLER)
    before = _run(trace, costs=old)
    survivors = _run(trace)
    assert survivors.median_recovery_s < before.median_recovery_s
    assert sum(survivors.moved_bytes) < sum(before.moved_bytes)
    # Holders write the checkpoints and survivors keep their state: nothing is read through
    # the controller; before, every checkpoint and every recovery read every layer.
    assert survivors.fetch_s == 0 and survivors.checkpoint_write_s > 0
    assert before.fetch_s > 0


def test_a_pure_pipeline_loses_exactly_the_steps_since_the_checkpoint():
    trace = FailureTrace((100.0,), 400, 0.0, seed=1)
    run = _run(trace, planner=FakePlanner(one_pipeline=True), interval=7)
    # One replica: the interrupted node's layers have no other holder.
    assert run.failures == 1
    assert run.moved_bytes[1] == NUM_LAYERS * GB  # every layer read back from the checkpoint
    assert 0 < run.lost_steps < 7


# -- checkpoint-restart ------------------------------------------------------------------------


def test_restart_goes_back_to_the_latest_registered_checkpoint():
    model = RestartModel(
        step_s=1.0,
        checkpoint_interval_steps=10,
        checkpoint_write_s=0.0,
        checkpoint_read_s=5.0,
        replace_after_s=1_000.0,
        restart_s=60.0,
        join_restart_s=60.0,
        registration_lag_s=2.5,
    )
    # The failure at 31.5 s: step 30's checkpoint (written at 30 s) registers at 32.5 s: too late.
    out = simulate_restart(model, FailureTrace((31.5,), 200.0, 0.0, seed=0))
    assert out.restarts == 1 and out.lost_steps == 11  # steps 20..30 are trained again
    # Back at step 20 after 65 s without training (31.5 -> 96.5 s), then 1 step/s past 200 s.
    assert out.committed_steps == 20 + math.ceil(200.0 - 96.5)
    none = simulate_restart(model, empty_trace(200.0))
    assert none.restarts == 0 and none.committed_steps == 200


def test_a_second_failure_in_a_burst_waits_out_its_backoff_on_simulated_time():
    # The second failure comes within the burst: its recovery waits a backoff. Survivors keep
    # their state, so nothing else moves the clock: the run must sleep through the wait.
    trace = FailureTrace((600.0, 605.0), 1_800, 0.0, seed=1)
    run = _run(trace)
    assert run.failures == 2 and len(run.recovery_s) == 2
    assert run.sim_s >= 1_800

"""A fixed plan is the one controller path with a planner that always returns the given plan:
it trains, ignores joins, resumes on the same plan once it fits again, and fails with a clear
reason while it does not (stepped on fakes, see control_fakes.py)."""

from __future__ import annotations

import math

import pytest
from control_fakes import GLOBAL_BATCH, NUM_LAYERS, make_harness

from orchestrator.control.events import ControllerStateName, EventKind
from orchestrator.control.planning import FixedPlanner, check_fits
from orchestrator.control.states import FailedState, FinishedState
from orchestrator.errors import InfeasibleError
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, ReplicaSpec, StageSpec
from orchestrator.spec.snapshot import ClusterSnapshot, NodeInfo

# num_layers 2 -> 4 planner layers (embedding, 2 blocks, head): the fakes' NUM_LAYERS.
MODEL = ModelSpec(
    name="gpt-fixed", num_layers=2, hidden_size=64, num_heads=2, sequence_length=32, vocab_size=256
)
TRAINING = TrainingSpec(global_batch_size=GLOBAL_BATCH, microbatch_sizes=[1])


def _plan(*replicas: tuple[int, list[tuple[int, int, str, str | None]]]) -> Plan:
    return Plan(
        global_batch_size=GLOBAL_BATCH,
        microbatch_size=1,
        replicas=tuple(
            ReplicaSpec(
                batch_size=batch,
                stages=tuple(StageSpec(layers=(a, b), device_type=t, node=n) for a, b, t, n in st),
            )
            for batch, st in replicas
        ),
    )


# Two A100-80 replicas, unpinned: any two A100-80 devices host it.
UNPINNED = _plan((8, [(0, NUM_LAYERS, "A100-80", None)]), (8, [(0, NUM_LAYERS, "A100-80", None)]))


def _fixed(h, plan: Plan) -> FixedPlanner:
    planner = FixedPlanner(plan, MODEL, TRAINING)
    h.controller.planner = planner
    return planner


def test_model_layers_match_the_fakes():
    assert MODEL.num_planner_layers == NUM_LAYERS


def test_returns_the_plan_with_the_cost_models_prediction_when_it_fits():
    snap = ClusterSnapshot.of(1, [NodeInfo("a", "A100-80", 2), NodeInfo("t", "T4", 1)])
    proposal = FixedPlanner(UNPINNED, MODEL, TRAINING)(snap, {"a": 3.0})
    assert proposal.plan == UNPINNED
    assert proposal.predicted_step_s > 0 and math.isnan(proposal.bound_step_s)


def test_does_not_fit_too_few_devices_or_a_missing_pinned_node():
    with pytest.raises(InfeasibleError, match="needs 2 A100-80 devices, 1 are usable"):
        check_fits(UNPINNED, ClusterSnapshot.of(1, [NodeInfo("a", "A100-80", 1)]))
    pinned = _plan((16, [(0, NUM_LAYERS, "A100-80", "a")]))
    with pytest.raises(InfeasibleError, match="pins a A100-80 stage to node a"):
        check_fits(pinned, ClusterSnapshot.of(1, [NodeInfo("b", "A100-80", 2)]))
    with pytest.raises(InfeasibleError, match="pins a A100-80 stage to node a"):
        check_fits(
            pinned, ClusterSnapshot.of(1, [NodeInfo("a", "T4", 2), NodeInfo("b", "A100-80", 1)])
        )
    check_fits(pinned, ClusterSnapshot.of(1, [NodeInfo("a", "A100-80", 1)]))


def test_trains_the_fixed_plan_and_keeps_it_when_a_node_joins():
    h = make_harness([("a", "A100-80", 2)], total_steps=12, checkpoint_interval_steps=4)
    _fixed(h, UNPINNED)
    h.states_until(lambda c: c.next_step == 5)
    h.cluster.add("b", "A100-80", 4)
    h.states_until(lambda c: c.done)
    c = h.controller
    assert isinstance(c.state, FinishedState) and c.state.steps == 12
    assert [plan for plan, _ in h.workers.launches] == [UNPINNED]
    skipped = [e for e in c.events if e.kind is EventKind.REPLAN_SKIPPED]
    assert any("keeps the current plan" in e.message for e in skipped), [e.message for e in skipped]
    assert h.workers.steps_run == list(range(12))


def test_a_lost_device_resumes_the_same_plan_once_it_fits_again():
    h = make_harness(
        [("a", "A100-80", 1), ("b", "A100-80", 1)], total_steps=12, checkpoint_interval_steps=4
    )
    _fixed(h, UNPINNED)
    h.states_until(lambda c: c.next_step == 6)
    h.cluster.kill("b")
    h.states_until(lambda c: c.state.name is ControllerStateName.DISCOVERING)
    waiting = [e for e in h.controller.events if e.kind is EventKind.REPLAN]
    assert "the fixed plan needs 2 A100-80 devices, 1 are usable" in waiting[-1].message
    h.cluster.add("c", "A100-80", 1)
    h.states_until(lambda c: c.done)
    c = h.controller
    assert isinstance(c.state, FinishedState)
    assert [plan for plan, _ in h.workers.launches] == [UNPINNED, UNPINNED]
    assert c.failure_count == 1


def test_a_fixed_plan_that_never_fits_again_fails_with_the_reason():
    h = make_harness(
        [("a", "A100-80", 1), ("b", "A100-80", 1)],
        total_steps=12,
        checkpoint_interval_steps=4,
        discovery_timeout_s=5.0,
    )
    _fixed(h, UNPINNED)
    h.states_until(lambda c: c.next_step == 6)
    h.cluster.kill("b")
    h.states_until(lambda c: c.done)
    state = h.controller.state
    assert isinstance(state, FailedState)
    assert "no plan fits" in state.reason and "needs 2 A100-80 devices" in state.reason
    assert state.checkpoint_step == 6  # the survivors' state, saved on the way out

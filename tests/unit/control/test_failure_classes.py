"""Failures classified instead of fatal: lost peers recover, out of memory lowers the device
type's usable memory and re-plans, errors in user code fail with the freshest checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from control_fakes import NUM_LAYERS, FakePlanner, make_harness

from orchestrator.control.events import EventKind
from orchestrator.control.planning import MakePlanPlanner
from orchestrator.control.states import FailedState, FinishedState
from orchestrator.costmodel import estimate_plan
from orchestrator.policies.failure_kinds import FailureKind, classify_failure
from orchestrator.policies.oom import MemoryCaps
from orchestrator.spec import ModelSpec, TrainingSpec
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.plan import Plan
from orchestrator.spec.snapshot import ClusterSnapshot, NodeInfo

GIB = 1024**3
# PyTorch 2.x's message, as the runtime forwards it ("<Type>: <message>").
CUDA_OOM = (
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.11 GiB of which 1.25 GiB is free. Including non-PyTorch memory, this process "
    "has 77.85 GiB memory in use. Of the allocated memory 75.10 GiB is allocated by PyTorch, and "
    "1.20 GiB is reserved by PyTorch but unallocated."
)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (CUDA_OOM, FailureKind.OUT_OF_MEMORY),
        ("MemoryError: ", FailureKind.OUT_OF_MEMORY),
        (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
            "by peer [10.0.0.2]:40131",
            FailureKind.LOST_PEER,
        ),
        ("RuntimeError: Timed out waiting 30000ms for recv operation", FailureKind.LOST_PEER),
        ("BrokenPipeError: [Errno 32] Broken pipe", FailureKind.LOST_PEER),
        (
            "DistBackendError: [Rank 3] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 600031 milliseconds",
            FailureKind.LOST_PEER,
        ),
        ("ZeroDivisionError: division by zero in the loss", FailureKind.USER_CODE),
        ("ValueError: timeout must be positive", FailureKind.USER_CODE),
        ("KeyError: 'input_ids'", FailureKind.USER_CODE),
        (  # the traceback's source lines do not count, only the error's own line
            "step: rank 1 failed: KeyError: 'x'\nTraceback (most recent call last):\n"
            '  File "train.py", line 9, in step\n    dist.all_reduce(t, timeout=30)',
            FailureKind.USER_CODE,
        ),
    ],
)
def test_step_errors_are_classified(text, kind):
    assert classify_failure(text).kind is kind


def test_out_of_memory_reads_what_the_process_held():
    found = classify_failure(CUDA_OOM)
    assert found.measured_usable_bytes == pytest.approx(77.85 * GIB)
    assert not found.host
    assert classify_failure("MemoryError: ").host
    without_in_use = (
        "CUDA out of memory. GPU 0 has a total capacity of 16 GiB of which 2 GiB is free"
    )
    assert classify_failure(without_in_use).measured_usable_bytes == pytest.approx(14 * GIB)


def test_memory_caps_only_go_down_and_apply_as_usable_memory():
    h100 = DeviceCatalog.builtin()["H100"]
    caps = MemoryCaps(margin_fraction=0.05)
    before, now = caps.lower(h100, 60 * GIB)
    assert before == h100.usable_memory_bytes and now == pytest.approx(57 * GIB)
    assert caps.lower(h100, 70 * GIB)[1] == pytest.approx(57 * GIB)  # never back up
    _, stepped = caps.lower(h100, None)  # nothing measured: 10 % down
    assert stepped == pytest.approx(57 * GIB * 0.9)
    capped = caps.apply(h100)
    assert capped.name == "H100" and capped.usable_memory_bytes == pytest.approx(stepped, abs=1)
    assert caps.apply(DeviceCatalog.builtin()["A100-80"]).usable_memory_bytes == (
        DeviceCatalog.builtin()["A100-80"].usable_memory_bytes
    )


def test_the_planner_plans_a_capped_type_within_its_cap():
    model = ModelSpec(
        name="m",
        num_layers=24,
        hidden_size=2048,
        num_heads=16,
        sequence_length=2048,
        vocab_size=32000,
        dtype="bf16",
    )
    training = TrainingSpec(global_batch_size=64, microbatch_sizes=[1, 2, 4, 8])
    planner = MakePlanPlanner(model, training)
    snap = ClusterSnapshot.of(1, [NodeInfo(f"n{i}", "H100", 8) for i in range(2)])
    before = planner(snap, {})
    cluster = snap.to_cluster(planner.catalog)

    def state_bytes(plan: Plan) -> float:
        # What the cap bounds: the peak less the runtime's fixed footprint ("peak" includes it).
        devices = estimate_plan(plan, cluster, model, training).devices
        return max(d.memory_bytes - d.framework_bytes for d in devices)

    peak = state_bytes(before.plan)
    planner.lower_usable_memory("H100", peak * 0.6)  # it ran out well below the plan's peak
    after = planner(snap, {})
    assert after.plan != before.plan
    assert state_bytes(after.plan) < peak * 0.6


# -- the controller --------------------------------------------------------------------------------


class StepFailed(Exception):
    """Like the runtime's error for a worker that raised while every worker stayed alive."""

    def __init__(self, rank: int, detail: str) -> None:
        super().__init__(f"step: rank {rank} failed: {detail}")
        self.rank = rank


@dataclass
class MemoryPlanner(FakePlanner):
    lowered: list[tuple[str, float | None]] = field(default_factory=list)

    def lower_usable_memory(self, device_type: str, measured: float | None):
        self.lowered.append((device_type, measured))
        return 80 * GIB, (measured or 0) * 0.95


THREE = [("a", "A100-80", 2), ("b", "L4", 2), ("c", "L4", 2)]


def test_out_of_memory_lowers_the_memory_of_the_rank_s_type_and_re_plans_without_loss():
    h = make_harness(THREE, total_steps=20)
    planner = MemoryPlanner()
    h.controller.planner = planner
    # Ranks are replica-major: node a holds ranks 0-1 (A100-80), b ranks 2-3 (L4).
    h.workers.step_errors[7] = StepFailed(2, CUDA_OOM)
    h.states_until(lambda c: c.done)
    assert isinstance(h.controller.state, FinishedState)
    assert planner.lowered == [("L4", pytest.approx(77.85 * GIB))]
    [event] = [e for e in h.controller.events if "usable memory of L4 lowered" in e.message]
    assert event.kind is EventKind.REPLAN and event.data["device_type"] == "L4"
    assert h.controller.failure_count == 1 and h.controller.lost_steps_total == 0
    assert len(planner.calls) >= 2  # planned again after the error
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}


def test_a_lost_peer_recovers_instead_of_failing():
    h = make_harness(THREE, total_steps=20)
    h.workers.step_errors[9] = RuntimeError(
        "[gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    )
    h.states_until(lambda c: c.done)
    assert isinstance(h.controller.state, FinishedState)
    assert h.controller.failure_count == 1 and h.controller.lost_steps_total == 0
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}


def test_a_bug_in_user_code_fails_with_its_text_and_the_last_committed_step_saved():
    h = make_harness(total_steps=20, checkpoint_interval_steps=5)
    trace = "Traceback (most recent call last):\n  File \"model.py\", line 3\nKeyError: 'x'"
    h.workers.step_errors[7] = StepFailed(0, trace)
    h.states_until(lambda c: c.done)
    state = h.controller.state
    assert isinstance(state, FailedState)
    assert 'File "model.py", line 3' in state.reason
    assert state.checkpoint_step == 7  # the state after 7 committed steps, read from the workers
    assert h.store.saved[7][0] == {i: tuple(range(7)) for i in range(NUM_LAYERS)}
    assert h.controller.failure_count == 0


def test_backoff_starts_again_after_a_quiet_stretch():
    four = [("a", "A100-80", 2), ("b", "A100-80", 2), ("c", "L4", 2), ("d", "L4", 2)]
    h = make_harness(four, total_steps=40)
    backoffs = []
    for node, quiet_s in (("a", 0.0), ("b", 0.0), ("c", 700.0)):
        h.states_until(lambda c: c.state.name == "running" and c.next_step > 3)
        h.clock.advance(quiet_s)
        h.cluster.kill(node)
        h.states_until(lambda c: c.state.name == "recovering")
        backoffs.append(h.controller.events[-1].data["backoff_s"])
    # 1st: none; 2nd right after: the first backoff step; 3rd 700 s later (> 600 s): a new burst.
    assert backoffs == [0.0, 1.0, 0.0]
    assert h.controller.failure_count == 3  # the budget still counts every failure


def test_a_failure_after_the_recovery_trained_stably_backs_off_from_zero():
    four = [("a", "A100-80", 2), ("b", "A100-80", 2), ("c", "L4", 2), ("d", "L4", 2)]
    h = make_harness(four, total_steps=400)
    c = h.controller
    backoffs = []

    def kill(node):
        h.cluster.kill(node)
        h.states_until(lambda c: c.state.name == "recovering")
        backoffs.append(c.events[-1].data["backoff_s"])
        h.states_until(lambda c: c.state.name == "running" and c.ledger.recovered_at is not None)
        return c.next_step, h.clock.now_s()

    h.states_until(lambda c: c.state.name == "running" and c.next_step > 3)
    step, at_s = kill("a")
    # Stable: 20 steps and 10 s trained after the recovery's first step (steps of ~0.1-1 s).
    h.states_until(lambda c: c.next_step >= step + 20 and h.clock.now_s() >= at_s + 10.0)
    step, at_s = kill("b")
    # Not stable: killed 5 steps after the recovery (a node dropping out right after).
    h.states_until(lambda c: c.next_step >= step + 5)
    assert h.clock.now_s() < at_s + 600.0
    kill("c")
    assert backoffs == [0.0, 0.0, 1.0]
    assert c.failure_count == 3  # the budget still counts every failure


def _nodes_of(plan):
    return {s.node for r in plan.replicas for s in r.stages}


def _planned_nodes(controller):
    return _nodes_of(controller.ledger.proposal.plan)


def test_an_excluded_node_rejoins_after_a_healthy_cool_down():
    h = make_harness(THREE, total_steps=200, rejoin_cooldown_s=60.0)
    h.states_until(lambda c: c.state.name == "running" and c.next_step == 5)
    h.cluster.kill("c")
    h.states_until(lambda c: c.state.name == "running" and "c" not in _planned_nodes(c))
    h.cluster.add("c", "L4", 2)  # the same node is back (a NotReady blip)
    back_at = h.clock.now_s()
    c = h.controller
    h.states_until(lambda c: h.clock.now_s() > back_at + 30)
    assert "c" in c.ledger.excluded_nodes and "c" not in _planned_nodes(c)  # cooling down
    h.states_until(lambda c: "c" in _planned_nodes(c))
    assert h.clock.now_s() >= back_at + 60
    [event] = [e for e in c.events if e.data.get("rejoined")]
    assert event.kind is EventKind.NODE_JOINED and event.data["node"] == "c"
    assert "c" not in c.ledger.excluded_nodes
    h.states_until(lambda c: c.done)
    assert h.final_layer_states() == {i: tuple(range(200)) for i in range(NUM_LAYERS)}


def test_a_node_that_leaves_again_restarts_its_cool_down():
    h = make_harness(THREE, total_steps=300, rejoin_cooldown_s=60.0)
    h.states_until(lambda c: c.state.name == "running" and c.next_step == 5)
    h.cluster.kill("c")
    h.states_until(lambda c: c.state.name == "running" and "c" not in _planned_nodes(c))
    h.cluster.add("c", "L4", 2)
    start = h.clock.now_s()
    h.states_until(lambda c: h.clock.now_s() > start + 40)
    h.cluster.kill("c")  # gone again before the cool-down ended
    h.states_until(lambda c: h.clock.now_s() > start + 50)
    h.cluster.add("c", "L4", 2)
    again = h.clock.now_s()
    h.states_until(lambda c: "c" in _planned_nodes(c))
    assert h.clock.now_s() >= again + 60


def test_the_backoff_reset_is_a_job_setting():
    from orchestrator.control.config import ControllerConfig
    from orchestrator.spec.elasticity import ElasticitySpec

    config = ControllerConfig.from_spec(
        ElasticitySpec(backoff_reset_after_s=120), total_steps=10, checkpoint_interval_steps=5
    )
    assert config.failure.reset_after_s == 120
    config = ControllerConfig.from_spec(
        ElasticitySpec(backoff_reset_after_stable_steps=50, backoff_reset_after_stable_s=30),
        total_steps=10,
        checkpoint_interval_steps=5,
    )
    assert (config.failure.stable_steps, config.failure.stable_s) == (50, 30.0)

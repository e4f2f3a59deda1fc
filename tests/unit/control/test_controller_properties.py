"""Property tests: random kills, joins, drains and throttling while the controller runs on fakes
(see control_fakes.py). Every committed step reaches the final model exactly once, the run
finishes, and the step counter goes back only on a checkpoint restore, by its lost steps."""

from __future__ import annotations

import itertools

from control_fakes import NUM_LAYERS, make_harness
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchestrator.control.recovery import RestoreKind
from orchestrator.control.states import FinishedState
from orchestrator.policies import FailurePolicy

TOTAL_STEPS = 40
_NAMES = itertools.count()  # node ids are never reused (Ray's are unique per raylet start)
INTERVAL = 5
ACTIONS = st.lists(
    st.tuples(
        st.integers(0, 50),  # before which controller.step() call (a run takes ~45)
        st.sampled_from(["kill", "kill_unnoticed", "join", "drain", "throttle"]),
        st.integers(0, 1_000),  # picks the node / device type / deadline
    ),
    max_size=10,
)


def _apply(h, action: str, pick: int, *, keep_replica: bool) -> None:
    cluster = h.cluster
    alive = sorted(n for n in cluster.nodes if n not in cluster.dead_but_listed)
    in_plan = (
        sorted({s.node for r in h.workers.plan.replicas for s in r.stages})
        if (h.workers.plan)
        else []
    )
    if action == "join":
        device = ["A100-80", "L4", "T4"][pick % 3]
        cluster.add(f"j{next(_NAMES)}", device, 1 + pick % 2)
        return
    if action == "throttle" and alive:
        h.workers.throttle[alive[pick % len(alive)]] = 1.0 + (pick % 4)
        return
    candidates = alive
    if keep_replica:  # leave at least one node of the running plan alive (it holds every layer)
        survivors = [n for n in in_plan if n in alive]
        if len(survivors) < 2:
            return
        candidates = [n for n in alive if n not in survivors[:1]]
    if not candidates:
        return
    victim = candidates[pick % len(candidates)]
    if action == "kill":
        cluster.kill(victim)
    elif action == "kill_unnoticed":
        cluster.kill(victim, noticed=False)
    elif action == "drain":
        cluster.drain(victim, h.clock.now_s() + (pick % 7))
    lasting = [n for n in cluster.nodes if n not in cluster.dead_but_listed | set(cluster.draining)]
    if not lasting:
        cluster.add(f"spare-{next(_NAMES)}", "T4", 1)  # never left without nodes


def _drive(actions, *, keep_replica: bool):
    h = make_harness(
        [("a", "A100-80", 2), ("b", "L4", 2), ("c", "T4", 1)],
        total_steps=TOTAL_STEPS,
        checkpoint_interval_steps=INTERVAL,
        failure=FailurePolicy(max_failures=1_000, initial_backoff_s=0.5, max_backoff_s=2),
        discovery_timeout_s=1e9,
    )
    c = h.controller
    counters = [c.next_step]
    for call in range(3_000):
        if c.done:
            break
        for at, action, pick in actions:
            if at == call:
                _apply(h, action, pick, keep_replica=keep_replica)
        h.step()
        counters.append(c.next_step)
    return h, counters


def _check_common(h, counters) -> list[int]:
    c = h.controller
    assert isinstance(c.state, FinishedState), c.state
    assert h.final_layer_states() == {i: tuple(range(TOTAL_STEPS)) for i in range(NUM_LAYERS)}
    drops = [a - b for a, b in itertools.pairwise(counters) if b < a]
    restores = [r for _, r in h.workers.launches]
    lost = [r.lost_steps for r in restores if r.kind is not RestoreKind.REPLICAS and r.lost_steps]
    # Each drop of the step counter is one restore's lost steps, at most a checkpoint interval
    # (launches that failed carry the same restore again, so compare as sets of values).
    assert sum(drops) == c.lost_steps_total
    assert all(0 < d <= INTERVAL for d in drops)
    assert set(drops) <= set(lost)
    assert all(r.lost_steps == 0 for r in restores if r.kind is RestoreKind.REPLICAS)
    event(f"failures: {min(c.failure_count, 3)}{'+' if c.failure_count > 3 else ''}")
    event(f"restores from checkpoint or seed: {len(drops)}")
    return drops


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS)
def test_chaos_run_keeps_every_committed_step(actions):
    h, counters = _drive(actions, keep_replica=False)
    _check_common(h, counters)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS)
def test_with_a_surviving_replica_the_step_counter_never_goes_back(actions):
    h, counters = _drive(actions, keep_replica=True)
    drops = _check_common(h, counters)
    assert drops == [] and h.controller.lost_steps_total == 0
    assert counters == sorted(counters)

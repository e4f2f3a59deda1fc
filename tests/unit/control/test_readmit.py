"""Slow nodes a re-plan left without work: the cool-down policy with literal numbers, and the
controller on fakes trying such a node again (back at speed, or still slow and dropped again
with a longer cool-down)."""

from __future__ import annotations

import pytest
from control_fakes import NUM_LAYERS, make_harness

from orchestrator.control.events import ControllerStateName, EventKind
from orchestrator.policies.readmit import ReadmitPolicy, Rule

RUNNING = ControllerStateName.RUNNING


# -- the policy ------------------------------------------------------------------------------


def test_an_idle_slow_node_is_due_after_its_cool_down():
    p = ReadmitPolicy(cooldown_s=60.0)
    p.track({"b"}, 100.0)
    assert p.due(159.0) is None
    p.track({"b"}, 150.0)  # still idle: its cool-down keeps counting from when it began
    assert p.due(160.0) == "b"


def test_a_node_given_work_again_forgets_its_cool_down():
    p = ReadmitPolicy(cooldown_s=60.0)
    p.track({"b"}, 100.0)
    p.track(set(), 130.0)  # a plan gave it work (or it is no longer planned as slow)
    p.track({"b"}, 140.0)
    assert p.due(190.0) is None and p.due(200.0) == "b"


def test_the_longest_overdue_node_goes_first_and_one_trial_at_a_time():
    p = ReadmitPolicy(cooldown_s=10.0)
    p.track({"b", "c"}, 0.0)
    p.track({"b", "c"}, 5.0)
    p.failed_trials["b"] = 1  # b's cool-down is 20 s now
    assert p.due(15.0) == "c"
    p.begin("c", 3.0, 1.0, 15.0)
    assert p.due(100.0) is None  # during c's trial nothing else is tried
    assert "c" not in p.idle_since_s


def test_a_trial_is_judged_after_a_window_against_the_expected_step():
    p = ReadmitPolicy(cooldown_s=60.0, threshold=1.3, window=5)
    p.begin("b", 3.0, expected_step_s=1.0, now_s=0.0)
    assert p.judge(4, 1.0) is None  # not a window yet
    back = p.judge(5, 1.2)
    assert back is not None and not back.still_slow and back.ratio == pytest.approx(1.2)
    assert p.trial is None and p.cooldown_for("b") == 60.0


# Trial plan of two replicas of two stages; the node on trial runs replica 1.
ON_NODE = {(1, 0), (1, 1)}


def test_contention_that_slows_every_stage_alike_finds_the_node_back():
    p = ReadmitPolicy(threshold=1.3, window=5)
    p.begin("b", 3.0, expected_step_s=1.0, now_s=0.0)
    alike = {(0, 0): 1.6, (0, 1): 1.62, (1, 0): 1.58, (1, 1): 1.6}  # the host is crowded
    verdict = p.judge(5, 1.6, alike, ON_NODE)
    assert verdict is not None and verdict.rule == Rule.STAGES and not verdict.still_slow
    assert verdict.node_ratio == pytest.approx(1.6)  # its slowest stage
    assert verdict.others_ratio == pytest.approx(1.6)  # the lower median of the others
    assert verdict.ratio == pytest.approx(1.0)
    # The whole step alone would have called it still slow: 1.6 s against 1.0 expected.
    p.begin("b", 3.0, expected_step_s=1.0, now_s=0.0)
    step_only = p.judge(5, 1.6)
    assert step_only is not None and step_only.rule == Rule.STEP and step_only.still_slow


def test_the_nodes_stages_alone_slow_find_it_still_slow():
    p = ReadmitPolicy(cooldown_s=60.0, threshold=1.3, window=5)
    p.begin("b", 3.0, expected_step_s=1.0, now_s=0.0)
    # Its stages 3x their prediction, the others 1.1x: 2.7x slower than the rest; one of its
    # stages at speed does not hide the other (the slowest counts).
    ratios = {(0, 0): 1.1, (0, 1): 1.1, (1, 0): 1.0, (1, 1): 2.97}
    verdict = p.judge(5, 3.0, ratios, ON_NODE)
    assert verdict is not None and verdict.rule == Rule.STAGES and verdict.still_slow
    assert verdict.ratio == pytest.approx(2.7)
    assert verdict.next_cooldown_s == 120.0 and p.failed_trials == {"b": 1}


def test_without_another_stage_to_compare_with_the_whole_step_judges():
    p = ReadmitPolicy(threshold=1.3, window=5)
    alone = {(0, 0): 1.6, (0, 1): 1.6}  # the node runs every stage of the trial plan
    for ratios in (alone, {}, None):
        p.begin("b", 3.0, expected_step_s=1.0, now_s=0.0)
        slow = p.judge(5, 1.6, ratios, {(0, 0), (0, 1)})
        assert slow is not None and slow.rule == Rule.STEP and slow.still_slow
        assert slow.ratio == pytest.approx(1.6) and slow.node_ratio is None
        p.begin("b", 3.0, expected_step_s=1.0, now_s=0.0)
        back = p.judge(5, 1.2, ratios, {(0, 0), (0, 1)})
        assert back is not None and back.rule == Rule.STEP and not back.still_slow
    # Only other stages measured (none of the node's): the step rule too.
    p.begin("b", 3.0, expected_step_s=1.0, now_s=0.0)
    others_only = p.judge(5, 1.2, {(0, 0): 1.0}, ON_NODE)
    assert others_only is not None and others_only.rule == Rule.STEP


# Trial plan of two one-stage replicas, 1.0 s predicted each; the node on trial runs replica 1.
PREDICTED = {(0, 0): 1.0, (1, 0): 1.0}


def _steps(p: ReadmitPolicy, node_s: list[float], other_s: float = 1.0) -> list[object]:
    """Hand the trial plan's steps to ``p``; what :meth:`judge_measured` said after each."""
    said = []
    for compute_s in node_s:
        p.observe({(0, 0): other_s, (1, 0): compute_s}, max(other_s, compute_s))
        said.append(p.judge_measured(PREDICTED, {(1, 0)}))
    return said


def test_a_trial_is_judged_on_the_window_after_its_settling_steps():
    """A freshly loaded rank runs its first steps after the re-formation slower than the rank
    that kept its state (measured on a Ray run: up to ~1.3x over the first window). The warm-up
    step and one window of settling steps are not judged; the next window is."""
    p = ReadmitPolicy(threshold=1.3, window=3)
    p.begin("b", 12.0, expected_step_s=1.0, now_s=0.0)
    warm_up, settling, judged = [3.0], [1.5, 1.45, 1.4], [1.06, 1.04, 1.05]
    said = _steps(p, warm_up + settling + judged)
    assert said[:-1] == [None] * 6
    verdict = said[-1]
    assert verdict is not None and verdict.rule == Rule.STAGES and not verdict.still_slow
    assert verdict.node_ratio == pytest.approx(1.05) and verdict.others_ratio == 1.0
    # Judging the first window after the warm-up would have found it still slow.
    assert verdict.settling_ratio == pytest.approx(1.45)
    assert verdict.measured_step_s == pytest.approx(1.05)
    assert p.trial is None and p.measured is None and p.failed_trials == {}


@pytest.mark.parametrize("throttle", [3.0, 12.0])
def test_a_node_still_throttled_is_still_slow_on_the_judged_window(throttle: float):
    p = ReadmitPolicy(cooldown_s=60.0, threshold=1.3, window=3)
    p.begin("b", throttle, expected_step_s=1.0, now_s=0.0)
    # Warming up on top of its throttle, then throttled; the other stage 1.1x its prediction.
    node_s = [throttle * f for f in (2.0, 1.4, 1.3, 1.2, 1.0, 1.0, 1.0)]
    verdict = _steps(p, node_s, other_s=1.1)[-1]
    assert verdict is not None and verdict.rule == Rule.STAGES and verdict.still_slow
    assert verdict.ratio == pytest.approx(throttle / 1.1)
    assert verdict.settling_ratio == pytest.approx(throttle * 1.3 / 1.1)
    assert verdict.next_cooldown_s == 120.0 and p.failed_trials == {"b": 1}


def test_the_settling_steps_can_be_set_and_the_step_rule_uses_the_judged_window_too():
    p = ReadmitPolicy(threshold=1.3, window=2, settle_steps=1)
    p.begin("b", 3.0, expected_step_s=1.0, now_s=0.0)
    for step_s in (5.0, 2.0):  # warm-up, settling: not judged
        p.observe({}, step_s)
        assert p.judge_measured({}, {(0, 0)}) is None
    p.observe({}, 1.1)
    assert p.judge_measured({}, {(0, 0)}) is None  # half a window
    p.observe({}, 1.3)
    verdict = p.judge_measured({}, {(0, 0)})
    assert verdict is not None and verdict.rule == Rule.STEP and not verdict.still_slow
    assert verdict.measured_step_s == pytest.approx(1.2) and verdict.ratio == pytest.approx(1.2)
    assert verdict.settling_ratio == pytest.approx(2.0)  # the settling step's, under its rule
    p.observe({}, 9.0)  # after the verdict: nothing on trial, nothing kept
    assert p.measured is None and p.judge_measured({}, {(0, 0)}) is None


def test_a_node_still_slow_waits_longer_each_time_up_to_the_cap():
    p = ReadmitPolicy(cooldown_s=60.0, backoff=2.0, max_cooldown_s=200.0, window=3)
    cooldowns = []
    for _ in range(4):
        p.begin("b", 3.0, expected_step_s=1.0, now_s=0.0)
        verdict = p.judge(3, 2.9)
        assert verdict is not None and verdict.still_slow
        cooldowns.append(verdict.next_cooldown_s)
    assert cooldowns == [120.0, 200.0, 200.0, 200.0]
    p.begin("b", 3.0, expected_step_s=1.0, now_s=0.0)
    verdict = p.judge(3, 1.0)  # back at speed: the cool-downs start over
    assert verdict is not None and not verdict.still_slow and verdict.next_cooldown_s == 60.0


def test_a_postponed_node_waits_one_more_cool_down_of_the_same_length():
    p = ReadmitPolicy(cooldown_s=60.0)
    p.track({"b"}, 0.0)
    assert p.due(60.0) == "b"
    p.postpone("b", 60.0)
    p.track({"b"}, 61.0)
    assert p.due(119.0) is None and p.due(120.0) == "b"
    assert p.cooldown_for("b") == 60.0


def test_an_abandoned_trial_counts_as_failed_only_when_the_node_was_found_slow():
    p = ReadmitPolicy(cooldown_s=60.0)
    p.begin("b", 3.0, 1.0, 0.0)
    assert p.abandon(found_slow=False) is not None and p.cooldown_for("b") == 60.0
    p.begin("b", 3.0, 1.0, 0.0)
    p.abandon(found_slow=True)
    assert p.cooldown_for("b") == 120.0 and p.trial is None


# -- the controller on fakes ------------------------------------------------------------------


def _dropped_harness(total_steps: int, stage_predictions: bool = False):
    """Two nodes; b is throttled 3x at step 10 and the planner leaves it out (no work)."""
    h = make_harness(
        [("a", "A100-80", 2), ("b", "A100-80", 2)],
        total_steps=total_steps,
        checkpoint_interval_steps=0,
        readmit_cooldown_s=30.0,
        readmit_backoff=2.0,
    )
    h.planner.drop_slowdown_at = 2.0
    h.planner.stage_predictions = stage_predictions
    h.states_until(lambda c: c.state.name is RUNNING and c.ledger.next_step >= 10)
    h.workers.throttle["b"] = 3.0
    h.states_until(lambda c: len(h.workers.launches) == 2 and c.state.name is RUNNING)
    plan = h.workers.launches[-1][0]
    assert {st.node for r in plan.replicas for st in r.stages} == {"a"}  # b left without work
    assert h.controller.ledger.slowdown_by_node == {"b": pytest.approx(3.0)}
    return h


def _nodes(plan) -> set[str]:
    return {st.node for r in plan.replicas for st in r.stages}


def test_a_dropped_straggler_that_cooled_down_gets_work_back_after_the_cool_down():
    h = _dropped_harness(total_steps=200)
    dropped_at_s = h.clock.now_s()
    h.workers.throttle["b"] = 1.0  # cooled down while it had no work: nothing measures it
    for _ in range(8):  # the speed-up rule cannot see it: b runs nothing
        h.step()
    assert h.controller.journal.of_kind(EventKind.SPEEDUP) == []
    assert len(h.workers.launches) == 2
    h.states_until(lambda c: len(h.workers.launches) == 3 and c.state.name is RUNNING)
    tried = h.controller.journal.of_kind(EventKind.READMIT)[0]
    assert tried.data["node"] == "b" and tried.data["cooldown_s"] == 30.0
    assert tried.time_s - dropped_at_s >= 30.0
    _, slowdown = h.planner.calls[-1]
    assert slowdown == {}  # planned at its labelled speed
    plan, restore = h.workers.launches[-1]
    assert [r.batch_size for r in plan.replicas] == [8, 8] and restore.lost_steps == 0
    replans = h.controller.journal.of_kind(EventKind.REPLAN)
    assert [e.data["trigger"] for e in replans] == ["straggler", "readmit"]
    h.states_until(lambda c: len(c.journal.of_kind(EventKind.READMIT)) == 2)
    verdict = h.controller.journal.of_kind(EventKind.READMIT)[1]
    assert verdict.data["still_slow"] is False and verdict.data["ratio"] == pytest.approx(1.0)
    assert h.controller.ledger.slowdown_by_node == {}
    h.states_until(lambda c: c.done)
    assert len(h.workers.launches) == 3  # no flapping once it is back
    assert h.final_layer_states() == {i: tuple(range(200)) for i in range(NUM_LAYERS)}


def test_a_readmitted_node_on_a_crowded_host_is_judged_against_the_other_stages():
    """Nodes sharing CPUs: with both working, every stage runs 1.6x slower than predicted. The
    trial's whole step is then 1.6x the expectation calibrated on a alone, yet b is at speed:
    its stages are as far off their prediction as a's, so it is back."""
    h = _dropped_harness(total_steps=200, stage_predictions=True)
    h.workers.contention[2] = 1.6
    h.workers.throttle["b"] = 1.0
    h.states_until(lambda c: len(c.journal.of_kind(EventKind.READMIT)) == 2, limit=2000)
    verdict = h.controller.journal.of_kind(EventKind.READMIT)[1]
    assert verdict.data["rule"] == Rule.STAGES and verdict.data["still_slow"] is False
    assert verdict.data["measured_step_s"] == pytest.approx(1.6)
    assert verdict.data["expected_step_s"] == pytest.approx(1.0)
    assert verdict.data["node_ratio"] == pytest.approx(1.6)
    assert verdict.data["others_ratio"] == pytest.approx(1.6)
    assert verdict.data["ratio"] == pytest.approx(1.0)
    assert h.controller.ledger.slowdown_by_node == {}
    h.states_until(lambda c: c.done, limit=2000)
    assert len(h.workers.launches) == 3  # kept: not dropped again
    assert h.final_layer_states() == {i: tuple(range(200)) for i in range(NUM_LAYERS)}


def test_a_readmitted_node_warming_up_after_the_re_formation_is_found_back():
    """b's first steps under the trial plan run slower than a's (a freshly loaded rank warming
    up: 1.5x, 1.45x, 1.4x after the warm-up step); judged on the window after those, it is back
    at speed and kept."""
    h = _dropped_harness(total_steps=200, stage_predictions=True)
    h.workers.throttle["b"] = 1.0
    h.workers.warmup["b"] = (2.0, 1.5, 1.45, 1.4, 1.0)
    h.states_until(lambda c: len(c.journal.of_kind(EventKind.READMIT)) == 2, limit=2000)
    verdict = h.controller.journal.of_kind(EventKind.READMIT)[1]
    assert verdict.data["rule"] == Rule.STAGES and verdict.data["still_slow"] is False
    assert verdict.data["ratio"] == pytest.approx(1.0)
    assert verdict.data["settle_steps"] == 5  # one straggler window (5 steps)
    assert verdict.data["settling_ratio"] == pytest.approx(1.4)  # the old rule's: still slow
    assert h.controller.ledger.slowdown_by_node == {}
    h.states_until(lambda c: c.done, limit=2000)
    assert len(h.workers.launches) == 3  # kept: not dropped again
    assert h.final_layer_states() == {i: tuple(range(200)) for i in range(NUM_LAYERS)}


def test_without_stage_predictions_the_crowded_trial_falls_back_to_the_whole_step():
    h = _dropped_harness(total_steps=200)
    h.workers.contention[2] = 1.6
    h.workers.throttle["b"] = 1.0
    h.states_until(lambda c: len(c.journal.of_kind(EventKind.READMIT)) == 2, limit=2000)
    verdict = h.controller.journal.of_kind(EventKind.READMIT)[1]
    assert verdict.data["rule"] == Rule.STEP and verdict.data["still_slow"] is True
    assert verdict.data["ratio"] == pytest.approx(1.6)


@pytest.mark.parametrize("stage_predictions", [False, True])
def test_a_dropped_straggler_still_slow_is_dropped_again_with_a_longer_cool_down(
    stage_predictions: bool,
):
    h = _dropped_harness(total_steps=400, stage_predictions=stage_predictions)
    h.states_until(lambda c: len(c.journal.of_kind(EventKind.READMIT)) == 2, limit=2000)
    tried, verdict = h.controller.journal.of_kind(EventKind.READMIT)
    assert tried.data["cooldown_s"] == 30.0
    assert verdict.data["still_slow"] is True
    # b's stages 3x their prediction, a's 1x (with predictions), or the whole step 3x expected.
    assert verdict.data["rule"] == (Rule.STAGES if stage_predictions else Rule.STEP)
    assert verdict.data["ratio"] == pytest.approx(3.0)
    # Trial plan: 8 samples each, expected 1 s/step; b's replica takes 3 s.
    assert verdict.data["expected_step_s"] == pytest.approx(1.0)
    assert verdict.data["measured_step_s"] == pytest.approx(3.0)
    assert verdict.data["cooldown_s"] == 60.0
    assert h.controller.ledger.slowdown_by_node == {"b": pytest.approx(3.0)}
    h.states_until(lambda c: len(h.workers.launches) == 4 and c.state.name is RUNNING)
    assert _nodes(h.workers.launches[-1][0]) == {"a"}  # dropped again
    dropped_again_s = h.clock.now_s()
    h.states_until(lambda c: len(c.journal.of_kind(EventKind.READMIT)) == 3, limit=2000)
    second_try = h.controller.journal.of_kind(EventKind.READMIT)[2]
    assert second_try.data["cooldown_s"] == 60.0
    assert second_try.time_s - dropped_again_s >= 60.0
    h.states_until(lambda c: c.done, limit=4000)
    # Tries came at 30, 60, 120, ... s idle: few switches over the run, every step once.
    tries = [e for e in h.controller.journal.of_kind(EventKind.READMIT) if "cooldown_s" in e.data]
    waits = [e.data["cooldown_s"] for e in tries if "still_slow" not in e.data]
    assert waits == sorted(waits) and waits[:3] == [30.0, 60.0, 120.0]
    assert h.final_layer_states() == {i: tuple(range(400)) for i in range(NUM_LAYERS)}


def test_a_due_node_the_switch_rule_refuses_keeps_its_slowdown_and_waits_again():
    h = _dropped_harness(total_steps=60)
    h.workers.throttle["b"] = 1.0
    object.__setattr__(h.controller.config.replan, "switch_threshold", 1e9)  # nothing pays
    h.states_until(
        lambda c: any(
            e.data.get("trigger") == "readmit" for e in c.journal.of_kind(EventKind.REPLAN_SKIPPED)
        )
    )
    skipped = [
        e for e in h.controller.journal.of_kind(EventKind.REPLAN_SKIPPED)
        if e.data.get("trigger") == "readmit"
    ]  # fmt: skip
    assert skipped[0].data["node"] == "b" and "tried again in 30 s" in skipped[0].message
    assert h.controller.ledger.slowdown_by_node == {"b": pytest.approx(3.0)}
    assert len(h.workers.launches) == 2
    h.states_until(lambda c: c.done)
    assert h.final_layer_states() == {i: tuple(range(60)) for i in range(NUM_LAYERS)}

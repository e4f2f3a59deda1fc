"""Policies are pure: literal numbers in, decisions as data out."""

from __future__ import annotations

import pytest

from orchestrator.errors import SpecError
from orchestrator.policies import (
    Evacuate,
    FailureDecision,
    FailurePolicy,
    NoopDecision,
    PreemptionPolicy,
    ReplanDecision,
    ReplanPolicy,
    StragglerDetector,
    TreatAsLost,
)
from orchestrator.spec.reports import StageTiming


def test_failure_backoff_doubles_then_caps_and_budget_runs_out():
    policy = FailurePolicy(
        max_failures=5, initial_backoff_s=1, backoff_multiplier=2, max_backoff_s=5
    )
    # The first failure re-plans at once; then 1, 2, 4, capped at 5.
    assert [policy.decide(n, "x").after_s for n in range(1, 6)] == [0, 1, 2, 4, 5]
    assert [policy.backoff_s(n) for n in range(1, 7)] == [0, 1, 2, 4, 5, 5]
    assert policy.decide(3, "x").failures_left == 2
    give_up = policy.decide(6, "node n1 lost")
    assert isinstance(give_up, FailureDecision.GIVE_UP)
    assert "6 failures" in give_up.reason and "allows 5" in give_up.reason
    assert "node n1 lost" in give_up.reason and "max_failures" in give_up.reason


def test_a_failure_after_stable_training_starts_a_new_burst():
    policy = FailurePolicy(reset_after_s=600.0, stable_steps=20, stable_s=10.0)
    # Recovered and trained 20 steps over 12 s since: a new burst (backoff from zero).
    assert policy.starts_burst(30.0, (20, 12.0))
    # Too few steps, or too few seconds, since the recovery: the same burst.
    assert not policy.starts_burst(30.0, (19, 12.0))
    assert not policy.starts_burst(30.0, (200, 9.0))
    # The recovery has not committed a step yet (a failure while recovering): the same burst.
    assert not policy.starts_burst(30.0, None)
    # Long past the previous failure: a new burst whatever was trained.
    assert policy.starts_burst(601.0, None)
    assert not policy.starts_burst(0.0, None)


def test_zero_budget_gives_up_on_first_failure():
    assert isinstance(FailurePolicy(max_failures=0).decide(1, "x"), FailureDecision.GIVE_UP)
    assert isinstance(FailurePolicy(max_failures=1).decide(1, "x"), FailureDecision.RETRY)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"max_failures": -1}, "max_failures"), ({"backoff_multiplier": 0.5}, "backoff_multiplier")],
)
def test_failure_policy_rejects_bad_settings_naming_the_field(kwargs, field):
    with pytest.raises(SpecError, match=field):
        FailurePolicy(**kwargs)


def test_switch_rule_matches_the_documented_example():
    policy = ReplanPolicy(switch_threshold=1.0)
    # 1.0 s/step now; candidate predicted 0.5 s x calibration 1.2 = 0.6 s; 200 steps left:
    # gain = 0.4 x 200 = 80 s > 1.0 x 20 s cost -> switch.
    switch = policy.decide(
        trigger="join",
        current_step_s=1.0,
        candidate_predicted_step_s=0.5,
        calibration=1.2,
        remaining_steps=200,
        switch_cost_s=20.0,
    )
    assert isinstance(switch, ReplanDecision)
    assert switch.gain_s == pytest.approx(80.0) and switch.cost_s == 20.0
    assert switch.numbers["expected_new_step_s"] == pytest.approx(0.6)
    # Same numbers, 20 steps left: gain 8 s <= 20 s -> keep the plan.
    keep = policy.decide(
        trigger="join",
        current_step_s=1.0,
        candidate_predicted_step_s=0.5,
        calibration=1.2,
        remaining_steps=20,
        switch_cost_s=20.0,
    )
    assert isinstance(keep, NoopDecision)
    assert keep.numbers["gain_s"] == pytest.approx(8.0)
    assert "keeping the plan" in keep.reason


def test_switch_threshold_scales_the_cost():
    args = dict(
        trigger="join",
        current_step_s=1.0,
        candidate_predicted_step_s=0.5,
        calibration=1.0,
        remaining_steps=100,
        switch_cost_s=20.0,
    )  # gain = 50 s
    assert isinstance(ReplanPolicy(switch_threshold=2.0).decide(**args), ReplanDecision)  # 50 > 40
    assert isinstance(ReplanPolicy(switch_threshold=3.0).decide(**args), NoopDecision)  # 50 <= 60


def test_a_slower_candidate_never_switches():
    decision = ReplanPolicy(switch_threshold=0.0).decide(
        trigger="join",
        current_step_s=1.0,
        candidate_predicted_step_s=1.5,
        calibration=1.0,
        remaining_steps=1000,
        switch_cost_s=0.0,
    )
    assert isinstance(decision, NoopDecision) and decision.numbers["gain_s"] < 0


def test_preemption_evacuates_before_the_deadline_and_gives_up_after():
    policy = PreemptionPolicy(safety_margin_s=2.0)
    early = policy.decide(100.0, {"n2": 110.0, "n1": 130.0})
    assert isinstance(early, Evacuate)
    assert early.node_ids == ("n1", "n2") and early.slack_s == pytest.approx(8.0)  # 110-100-2
    late = policy.decide(109.0, {"n2": 110.0})  # inside the safety margin
    assert isinstance(late, TreatAsLost) and late.overdue_s == pytest.approx(1.0)
    unknown = policy.decide(100.0, {"n3": None})
    assert isinstance(unknown, Evacuate) and unknown.slack_s is None


def _timings(*compute_s: float) -> tuple[StageTiming, ...]:
    return tuple(StageTiming(0, i, "T4", c, 1.0) for i, c in enumerate(compute_s))


def test_straggler_needs_a_persistent_slowdown_against_a_learned_baseline():
    detector = StragglerDetector(window=3, threshold=1.3, warmup_steps=1)
    detector.observe(_timings(9.0, 9.0))  # warm-up, ignored
    for _ in range(3):  # baseline 1.0 s for both stages
        assert detector.observe(_timings(1.0, 1.0)) == []
    assert detector.baseline_s == {(0, 0): 1.0, (0, 1): 1.0}
    assert detector.observe(_timings(1.0, 5.0)) == []  # one spike
    assert detector.observe(_timings(1.0, 1.0)) == []
    for _ in range(2):
        assert detector.observe(_timings(1.0, 2.0)) == []  # window not yet all slow
    found = detector.observe(_timings(1.0, 2.2))
    assert [(s.stage, s.slowdown_factor) for s in found] == [(1, pytest.approx(2.0))]
    # After accepting the new speed, the same slowness does not fire again.
    detector.rebase((0, 1), found[0].measured_s)
    assert all(detector.observe(_timings(1.0, 2.0)) == [] for _ in range(5))


def test_straggler_uses_predicted_baselines_when_given():
    detector = StragglerDetector.with_predictions(
        {(0, 0): 0.5, (0, 1): 1.0}, window=2, warmup_steps=0
    )
    assert detector.observe(_timings(0.6, 1.0)) == []  # 1.2x: below the 1.3 threshold
    found = detector.observe(_timings(0.8, 1.0)) + detector.observe(_timings(0.8, 1.0))
    assert len(found) == 1 and found[0].slowdown_factor == pytest.approx(1.6)


def _run(detector: StragglerDetector, steps: int, *compute_s: float) -> list:
    found = []
    for _ in range(steps):
        found += detector.observe(_timings(*compute_s))
    return found


def test_a_slowdown_of_every_rank_alike_is_not_a_straggler():
    # Host contention: every stage 1.3x (then 2x) slower than its learned baseline at once.
    detector = StragglerDetector(window=3, threshold=1.3, warmup_steps=0)
    assert _run(detector, 3, 1.0, 0.5, 2.0) == []  # baselines 1.0, 0.5, 2.0
    assert _run(detector, 10, 1.35, 0.675, 2.7) == []
    assert _run(detector, 10, 2.0, 1.0, 4.0) == []
    # Against predictions too: the cost model off by 1.4x for every stage alike.
    predicted = StragglerDetector.with_predictions({(0, 0): 1.0, (0, 1): 1.0}, window=3)
    assert _run(predicted, 10, 1.4, 1.4) == []


def test_one_rank_slower_than_the_others_is_a_straggler_even_under_host_contention():
    detector = StragglerDetector(window=3, threshold=1.3, warmup_steps=0)
    _run(detector, 3, 1.0, 1.0, 1.0)
    found = _run(detector, 3, 1.0, 1.5, 1.0)  # one rank 1.5x slower than the others
    assert [(s.stage, s.slowdown_factor) for s in found] == [(1, pytest.approx(1.5))]
    # Every rank 1.3x slower from the host, and one 1.5x slower again: found, at its own 1.5x.
    detector = StragglerDetector(window=3, threshold=1.3, warmup_steps=0)
    _run(detector, 3, 1.0, 1.0, 1.0)
    found = _run(detector, 3, 1.3, 1.95, 1.3)
    assert [(s.stage, s.slowdown_factor) for s in found] == [(1, pytest.approx(1.5))]
    assert found[0].measured_s == pytest.approx(1.95)


def test_up_to_half_the_ranks_slow_are_each_found():
    detector = StragglerDetector(window=3, threshold=1.3, warmup_steps=0)
    _run(detector, 3, 1.0, 1.0, 1.0, 1.0)
    found = _run(detector, 3, 1.0, 2.0, 2.0, 1.0)
    assert sorted((s.stage, round(s.slowdown_factor, 6)) for s in found) == [(1, 2.0), (2, 2.0)]


def test_a_stage_alone_is_never_a_straggler():
    detector = StragglerDetector(window=3, threshold=1.3, warmup_steps=0)
    _run(detector, 3, 1.0)
    assert _run(detector, 10, 3.0) == []  # nothing to tell it from the host's slowdown

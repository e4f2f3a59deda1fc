"""When a slow node that a re-plan left without work is tried again.

The speed-up rule (``policies/straggler.py``) judges a node planned as slow by its stages'
measured times; a node the new plan gives no work has none, so it would stay out for good even
after it cooled down. This policy gives such a node a way back:

- A node planned as slow (a measured slowdown above 1) that the running plan gives no work is
  *idle*. Once it has been idle for its cool-down, it is *due*: the controller asks the planner
  again with the node at its labelled speed (its measured slowdown left out) and, if that plan
  gives the node work and the switch rule takes it, switches: the node is *on trial*.
- A trial is judged once the new plan has run ``window`` measured steps, by one of two rules:

  * *stages* (whenever the trial plan has a stage off the node with a measured window): as the
    straggler rule judges (``policies/straggler.py``), each stage's measured / predicted compute
    time (the median of its window over the cost model's prediction for the trial plan), the
    node's slowest stage against the lower median of the other stages'. A slowdown that hits
    every stage alike (nodes sharing CPUs, a contended cluster, a model that is off for the
    whole plan) cancels out; only the node being slower than the rest counts.
  * *step* (the fallback: the node runs every measured stage, e.g. it is the only worker, or the
    controller has no per-stage predictions or timings): the trial plan's measured step time
    (the median over the window) against what the switch rule expected of it.

  A ratio above ``threshold``: the node is *still slow*; it gets its old slowdown back (a re-plan
  drops it again) and its next cool-down is ``backoff`` times longer, up to ``max_cooldown_s``,
  so a node that stays slow costs a trial less and less often (no flapping). Otherwise it is
  *back*: its cool-downs start over from ``cooldown_s``.
- A due node whose candidate gives it no work, or whose switch the rule refuses, keeps its
  slowdown and waits one more cool-down of the same length.
- One trial at a time: a trial's step time says nothing about which of two nodes is slow.

Pure: the controller passes the clock and the measurements in and acts on what comes back.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from orchestrator.spec.plan import Plan


@dataclass(frozen=True)
class Trial:
    """A node given work again at its labelled speed, and what its plan was expected to take."""

    node: str
    slowdown: float  # the measured slowdown it was planned with before the trial
    expected_step_s: float  # the switch rule's expected step time of the trial's plan
    started_s: float
    plan: Plan | None = None  # the plan that gives it work (its verdict is judged on that plan)
    calibration: float = 1.0  # the switch rule's calibration before the trial (see judge)


StageKey = tuple[int, int]  # (replica, stage)


class Rule:
    """Which rule judged a trial (see the module docstring)."""

    STAGES = "stages"  # the node's stages against the other stages, each against its prediction
    STEP = "step"  # the whole step against the switch rule's expectation (the fallback)


@dataclass(frozen=True)
class Verdict:
    """A trial judged: ``still_slow`` or back. ``ratio`` is what was held against the threshold:
    under :attr:`Rule.STAGES` the node's measured / predicted over the other stages' (then
    ``node_ratio`` and ``others_ratio`` are those two), under :attr:`Rule.STEP` measured /
    expected step time."""

    trial: Trial
    still_slow: bool
    measured_step_s: float
    ratio: float
    next_cooldown_s: float  # the cool-down the node gets if it is dropped again
    rule: str = Rule.STEP
    node_ratio: float | None = None
    others_ratio: float | None = None


@dataclass
class ReadmitPolicy:
    """Cool-downs and trials of slow nodes left without work (see the module docstring)."""

    cooldown_s: float = 60.0
    backoff: float = 2.0
    max_cooldown_s: float = 1800.0
    threshold: float = 1.3
    window: int = 5
    idle_since_s: dict[str, float] = field(default_factory=dict)
    failed_trials: dict[str, int] = field(default_factory=dict)  # in a row, per node
    trial: Trial | None = None

    def cooldown_for(self, node: str) -> float:
        """The node's current cool-down: longer after each trial that found it still slow."""
        failed = self.failed_trials.get(node, 0)
        return min(self.cooldown_s * self.backoff**failed, self.max_cooldown_s)

    def track(self, idle_slow: Set[str], now_s: float) -> None:
        """Tell the policy which slow nodes have no work now; others are forgotten."""
        for node in list(self.idle_since_s):
            if node not in idle_slow:
                del self.idle_since_s[node]
        for node in sorted(idle_slow):
            self.idle_since_s.setdefault(node, now_s)

    def due(self, now_s: float) -> str | None:
        """The idle node to try now (the longest overdue), or None; never during a trial."""
        if self.trial is not None:
            return None
        overdue = [
            (now_s - since - self.cooldown_for(node), node)
            for node, since in self.idle_since_s.items()
            if now_s - since >= self.cooldown_for(node)
        ]
        return max(overdue)[1] if overdue else None

    def postpone(self, node: str, now_s: float) -> None:
        """The due node was not given work: it waits one more cool-down of the same length."""
        self.idle_since_s[node] = now_s

    def begin(
        self,
        node: str,
        slowdown: float,
        expected_step_s: float,
        now_s: float,
        plan: Plan | None = None,
        calibration: float = 1.0,
    ) -> Trial:
        """The switch to ``plan``, which gives ``node`` work at its labelled speed, was taken."""
        self.idle_since_s.pop(node, None)
        self.trial = Trial(node, slowdown, expected_step_s, now_s, plan, calibration)
        return self.trial

    def judge(
        self,
        measured_steps: int,
        measured_step_s: float,
        stage_ratios: Mapping[StageKey, float] | None = None,
        node_stages: Set[StageKey] = frozenset(),
    ) -> Verdict | None:
        """After the trial plan's ``window`` measured steps: the verdict (the trial ends).

        ``stage_ratios``: each stage of the trial plan with a full window, its measured /
        predicted compute time; ``node_stages``: the stages on the node on trial. With a ratio
        for one of the node's stages and for a stage elsewhere, the stages rule judges; else the
        step rule (see the module docstring)."""
        trial = self.trial
        if trial is None or measured_steps < self.window:
            return None
        self.trial = None
        ratios = {k: r for k, r in (stage_ratios or {}).items() if r > 0}
        own = [r for k, r in ratios.items() if k in node_stages]
        rest = [r for k, r in ratios.items() if k not in node_stages]
        node_ratio = others = None
        if own and rest:
            rule = Rule.STAGES
            # Its slowest stage counts, as for the straggler rule's factor per node; the lower
            # median of the rest lets up to half of them be slow too and still tell.
            node_ratio, others = max(own), statistics.median_low(rest)
            ratio = node_ratio / others
        else:
            rule = Rule.STEP
            expected_s = trial.expected_step_s
            ratio = measured_step_s / expected_s if expected_s > 0 else 1.0
        still_slow = ratio > self.threshold
        if still_slow:
            self.failed_trials[trial.node] = self.failed_trials.get(trial.node, 0) + 1
        else:
            self.failed_trials.pop(trial.node, None)
        return Verdict(
            trial,
            still_slow,
            measured_step_s,
            ratio,
            self.cooldown_for(trial.node),
            rule,
            node_ratio,
            others,
        )

    def abandon(self, found_slow: bool) -> Trial | None:
        """Another plan replaced the trial's before its verdict; ``found_slow``: the straggler
        rule found the node slow meanwhile (that counts as a failed trial)."""
        trial, self.trial = self.trial, None
        if trial is not None and found_slow:
            self.failed_trials[trial.node] = self.failed_trials.get(trial.node, 0) + 1
        return trial

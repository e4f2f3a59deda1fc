"""When a slow node that a re-plan left without work is tried again.

The speed-up rule (``policies/straggler.py``) judges a node planned as slow by its stages'
measured times; a node the new plan gives no work has none, so it would stay out for good even
after it cooled down. This policy gives such a node a way back:

- A node planned as slow (a measured slowdown above 1) that the running plan gives no work is
  *idle*. Once it has been idle for its cool-down, it is *due*: the controller asks the planner
  again with the node at its labelled speed (its measured slowdown left out) and, if that plan
  gives the node work and the switch rule takes it, switches: the node is *on trial*.
- A trial is judged on the trial plan's own steps (:class:`TrialWindow`): the launch's warm-up
  step and the next ``settle_steps`` (by default one ``window``) are not judged, since the first
  steps after a re-formation run slower on a freshly started or freshly loaded rank (lazy
  initialisation, caches, an emulated device still learning its reference time) and slower on
  it than on ranks that kept their state; the ``window`` steps after those are. By one of two
  rules:

  * *stages* (whenever the trial plan has a stage off the node with a measured window): as the
    straggler rule judges (``policies/straggler.py``), each stage's measured / predicted compute
    time (the median of its judged window over the cost model's prediction for the trial plan),
    the node's slowest stage against the lower median of the other stages' over the same steps.
    A slowdown that hits every stage alike (nodes sharing CPUs, a contended cluster, a model
    that is off for the whole plan) cancels out; only the node being slower than the rest counts.
  * *step* (the fallback: the node runs every measured stage, e.g. it is the only worker, or the
    controller has no per-stage predictions or timings): the trial plan's measured step time
    (the median over the judged window) against what the switch rule expected of it.

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
from dataclasses import dataclass, field, replace

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


@dataclass
class TrialWindow:
    """The trial plan's steps as measured: each stage's compute time and the step time, kept for
    the ``settle_steps`` after the launch's ``warmup_steps`` (not judged: see the module
    docstring) and the ``window`` steps after those (judged)."""

    window: int
    settle_steps: int
    warmup_steps: int = 1
    steps: int = 0  # steps seen under the trial plan, the unjudged ones included
    _rows: list[tuple[dict[StageKey, float], float]] = field(default_factory=list)

    def observe(self, stage_compute_s: Mapping[StageKey, float], step_s: float) -> None:
        """One step of the trial plan: each stage's compute time, and the step's."""
        self.steps += 1
        if self.steps > self.warmup_steps and len(self._rows) < self.settle_steps + self.window:
            self._rows.append((dict(stage_compute_s), step_s))

    @property
    def judged_steps(self) -> int:
        """Steps past the warm-up and the settling steps (the verdict waits for ``window``)."""
        return max(0, len(self._rows) - self.settle_steps)

    def step_s(self, settling: bool = False) -> float:
        """The median step time of the judged window (``settling``: of the last ``window`` of
        the settling steps); 0 before one was measured."""
        rows = self._window(settling)
        return statistics.median(step_s for _, step_s in rows) if rows else 0.0

    def stage_ratios(
        self, predicted_s: Mapping[StageKey, float], settling: bool = False
    ) -> dict[StageKey, float]:
        """Each stage timed in every step of the judged window (``settling``: of the settling
        steps' last window) and predicted: the median of its times over its predicted compute
        time. Every stage is measured over the same steps."""
        rows = self._window(settling)
        keys = set.intersection(*(set(r) for r, _ in rows)) if rows else set()
        return {
            key: statistics.median(r[key] for r, _ in rows) / predicted_s[key]
            for key in sorted(keys)
            if predicted_s.get(key, 0.0) > 0
        }

    def _window(self, settling: bool) -> list[tuple[dict[StageKey, float], float]]:
        if settling:
            return self._rows[: self.settle_steps][-self.window :]
        return self._rows[self.settle_steps : self.settle_steps + self.window]


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
    # The same rule over the settling steps (what judging the first window after the launch
    # would have said; None without settling steps): kept for the record, never acted on.
    settling_ratio: float | None = None


@dataclass
class ReadmitPolicy:
    """Cool-downs and trials of slow nodes left without work (see the module docstring)."""

    cooldown_s: float = 60.0
    backoff: float = 2.0
    max_cooldown_s: float = 1800.0
    threshold: float = 1.3
    window: int = 5
    settle_steps: int | None = None  # trial steps not judged after the warm-up; None: window
    idle_since_s: dict[str, float] = field(default_factory=dict)
    failed_trials: dict[str, int] = field(default_factory=dict)  # in a row, per node
    trial: Trial | None = None
    measured: TrialWindow | None = None  # the trial plan's steps (while a trial runs)

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
        self.measured = TrialWindow(self.window, self.settling_steps)
        return self.trial

    @property
    def settling_steps(self) -> int:
        """Steps of a trial plan not judged after its warm-up step (``settle_steps``, or one
        ``window`` by default)."""
        return self.window if self.settle_steps is None else self.settle_steps

    def observe(self, stage_compute_s: Mapping[StageKey, float], step_s: float) -> None:
        """A step of the trial plan (each stage's compute time, the step time); no-op without
        a trial."""
        if self.measured is not None and self.trial is not None:
            self.measured.observe(stage_compute_s, step_s)

    def judge_measured(
        self, predicted_stage_s: Mapping[StageKey, float], node_stages: Set[StageKey]
    ) -> Verdict | None:
        """The verdict on the steps :meth:`observe` was given (see :meth:`judge`), once the
        trial plan has run its warm-up, settling and judged window; else None."""
        m, trial = self.measured, self.trial
        if trial is None or m is None:
            return None
        verdict = self.judge(
            m.judged_steps, m.step_s(), m.stage_ratios(predicted_stage_s), node_stages
        )
        if verdict is None or m.settle_steps == 0:
            return verdict
        settled = m.stage_ratios(predicted_stage_s, settling=True)
        _, settling_ratio, _, _ = _relative(trial, m.step_s(settling=True), settled, node_stages)
        return replace(verdict, settling_ratio=settling_ratio)

    def judge(
        self,
        measured_steps: int,
        measured_step_s: float,
        stage_ratios: Mapping[StageKey, float] | None = None,
        node_stages: Set[StageKey] = frozenset(),
    ) -> Verdict | None:
        """After ``window`` judged steps of the trial plan: the verdict (the trial ends).

        ``stage_ratios``: each stage of the trial plan with a full window, its measured /
        predicted compute time; ``node_stages``: the stages on the node on trial. With a ratio
        for one of the node's stages and for a stage elsewhere, the stages rule judges; else the
        step rule (see the module docstring)."""
        trial = self.trial
        if trial is None or measured_steps < self.window:
            return None
        self.trial = self.measured = None
        rule, ratio, node_ratio, others = _relative(
            trial, measured_step_s, stage_ratios or {}, node_stages
        )
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
        trial, self.trial, self.measured = self.trial, None, None
        if trial is not None and found_slow:
            self.failed_trials[trial.node] = self.failed_trials.get(trial.node, 0) + 1
        return trial


def _relative(
    trial: Trial,
    measured_step_s: float,
    stage_ratios: Mapping[StageKey, float],
    node_stages: Set[StageKey],
) -> tuple[str, float, float | None, float | None]:
    """The rule that applies, the ratio it holds against the threshold, and under the stages
    rule the node's and the others' measured / predicted (see the module docstring)."""
    ratios = {k: r for k, r in stage_ratios.items() if r > 0}
    own = [r for k, r in ratios.items() if k in node_stages]
    rest = [r for k, r in ratios.items() if k not in node_stages]
    if own and rest:
        # Its slowest stage counts, as for the straggler rule's factor per node; the lower
        # median of the rest lets up to half of them be slow too and still tell.
        node_ratio, others = max(own), statistics.median_low(rest)
        return Rule.STAGES, node_ratio / others, node_ratio, others
    expected_s = trial.expected_step_s
    return Rule.STEP, measured_step_s / expected_s if expected_s > 0 else 1.0, None, None

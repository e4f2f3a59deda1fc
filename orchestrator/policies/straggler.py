"""Straggler detection: a stage that runs persistently slower than its baseline *and* than the
other stages.

Each (replica, stage) has a baseline compute time: the cost model's prediction when the planner
gave one, else the median of its first ``window`` measured steps after launch (skipping
``warmup_steps``). A stage is a straggler when

- each of its last ``window`` measurements exceeds its baseline by more than ``threshold``
  (1.3 = 30 % slower): one slow step (a GC pause, a checkpoint) never triggers; and
- its slowdown (the median of the window over the baseline) exceeds the other stages' by more
  than ``threshold``: the others' is the lower median of their own slowdowns, over the stages
  whose window is full.

The second condition is what tells a straggler from a slowdown that hits every rank alike (the
host's load, a shared file system, a cluster-wide clock change): every stage 1.3x slower than
its baseline is no straggler, one stage 1.5x slower than the others is. The lower median lets
up to half the stages be slow and still be found. A stage with no other stage measured has
nothing to be compared with and is never a straggler: its slowdown cannot be told from the
host's. The factor reported (and planned with) is the slowdown relative to the others.

The other way round, a stage that speeds up (a throttled device that cooled down) is judged
against what it *measured* (the median of its first ``window`` steps after launch, or the speed
accepted by :meth:`StragglerDetector.rebase`), never against a prediction, which may be off by
more than the threshold: :meth:`StragglerDetector.speedups` names the stages whose every one of
the last ``window`` measurements is below that by more than ``threshold`` and whose speed-up
beats the other stages' by more than ``threshold`` too (a host that got quieter speeds every
stage up alike). A stage alone is judged against what it measured only: a node planned as slow
that runs alone loses nothing by being planned at its measured speed again.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.spec.reports import StageTiming

StageKey = tuple[int, int]  # (replica, stage)


@dataclass(frozen=True)
class Straggler:
    """A stage found persistently slow, with the factor it is slower by than the other stages
    (each against its baseline); ``measured_s`` is the median of its window."""

    replica: int
    stage: int
    device_type: str
    slowdown_factor: float
    baseline_s: float
    measured_s: float


@dataclass(frozen=True)
class Speedup:
    """A stage found persistently faster than it measured before: ``factor`` < 1."""

    replica: int
    stage: int
    device_type: str
    factor: float  # measured now / measured before, over the other stages' same ratio
    before_s: float
    measured_s: float


@dataclass
class StragglerDetector:
    """Feed it stage timings step by step; it returns the stragglers it finds."""

    window: int = 5
    threshold: float = 1.3
    warmup_steps: int = 1
    baseline_s: dict[StageKey, float] = field(default_factory=dict)
    _seen: dict[StageKey, int] = field(default_factory=dict)
    _warm: dict[StageKey, list[float]] = field(default_factory=dict)
    _recent: dict[StageKey, deque[float]] = field(default_factory=dict)
    # What each stage measured (first window after warm-up, or as rebased), for speed-ups.
    measured_s: dict[StageKey, float] = field(default_factory=dict)
    _measuring: dict[StageKey, list[float]] = field(default_factory=dict)
    _latest: dict[StageKey, deque[float]] = field(default_factory=dict)
    _types: dict[StageKey, str] = field(default_factory=dict)

    @classmethod
    def with_predictions(
        cls, predicted_s: Mapping[StageKey, float], **kwargs: float
    ) -> StragglerDetector:
        """A detector whose baselines are the cost model's per-stage predictions."""
        detector = cls(**kwargs)  # type: ignore[arg-type]
        detector.baseline_s = {k: v for k, v in predicted_s.items() if v > 0}
        return detector

    def observe(self, timings: tuple[StageTiming, ...]) -> list[Straggler]:
        """Record one step's timings; return the stages that are now persistently slow, both
        against their baseline and against the other stages (see the module docstring)."""
        judged: list[tuple[StageKey, str]] = []
        for t in timings:
            key = (t.replica, t.stage)
            seen = self._seen.get(key, 0) + 1
            self._seen[key] = seen
            if seen <= self.warmup_steps:
                continue
            self._measure(key, t.device_type, t.compute_s)
            if key not in self.baseline_s:
                self._learn_baseline(key, t.compute_s)
                continue
            self._recent.setdefault(key, deque(maxlen=self.window)).append(t.compute_s)
            judged.append((key, t.device_type))
        slowdowns = self._slowdowns()
        found = []
        for key, device_type in judged:
            straggler = self._judge(key, device_type, slowdowns)
            if straggler is not None:
                found.append(straggler)
        return found

    def rebase(self, key: StageKey, baseline_s: float) -> None:
        """Accept the stage's current speed as its new baseline (after a decision not to act)."""
        self.baseline_s[key] = baseline_s
        self._recent.pop(key, None)
        self.measured_s[key] = baseline_s
        self._latest.pop(key, None)

    def speedups(self, keys: set[StageKey] | None = None) -> list[Speedup]:
        """Stages (of ``keys``, or all) persistently faster than they measured before, and by
        more than the threshold beyond the other stages' change (see the module docstring)."""
        changes = {
            key: statistics.median(latest) / self.measured_s[key]
            for key, latest in self._latest.items()
            if len(latest) >= self.window and self.measured_s.get(key, 0.0) > 0
        }
        found = []
        for key, latest in sorted(self._latest.items()):
            before = self.measured_s.get(key)
            if (keys is not None and key not in keys) or before is None or before <= 0:
                continue
            if len(latest) < self.window or max(latest) * self.threshold >= before:
                continue
            now = statistics.median(latest)
            others = _others(changes, key)
            if others is None:  # alone: against what it measured only
                found.append(Speedup(key[0], key[1], self._types[key], now / before, before, now))
                continue
            relative = (now / before) / others
            if relative * self.threshold >= 1.0:  # every stage sped up alike: the host
                continue
            found.append(Speedup(key[0], key[1], self._types[key], relative, before, now))
        return found

    def _measure(self, key: StageKey, device_type: str, compute_s: float) -> None:
        self._types[key] = device_type
        if key not in self.measured_s:
            warm = self._measuring.setdefault(key, [])
            warm.append(compute_s)
            if len(warm) >= self.window:
                self.measured_s[key] = statistics.median(warm)
            return
        self._latest.setdefault(key, deque(maxlen=self.window)).append(compute_s)

    def _learn_baseline(self, key: StageKey, compute_s: float) -> None:
        warm = self._warm.setdefault(key, [])
        warm.append(compute_s)
        if len(warm) >= self.window:
            self.baseline_s[key] = statistics.median(warm)

    def _slowdowns(self) -> dict[StageKey, float]:
        """Each stage with a full window: the median of the window over its baseline."""
        return {
            key: statistics.median(recent) / self.baseline_s[key]
            for key, recent in self._recent.items()
            if len(recent) >= self.window and self.baseline_s.get(key, 0.0) > 0
        }

    def _judge(
        self, key: StageKey, device_type: str, slowdowns: Mapping[StageKey, float]
    ) -> Straggler | None:
        baseline = self.baseline_s[key]
        recent = self._recent[key]
        if len(recent) < self.window or baseline <= 0:
            return None
        if min(recent) <= baseline * self.threshold:
            return None
        others = _others(slowdowns, key)
        if others is None or others <= 0:  # nothing to tell it from the host's slowdown
            return None
        relative = slowdowns[key] / others
        if relative <= self.threshold:  # the others are as slow: a slowdown of every rank
            return None
        return Straggler(
            replica=key[0],
            stage=key[1],
            device_type=device_type,
            slowdown_factor=relative,
            baseline_s=baseline,
            measured_s=statistics.median(recent),
        )


def _others(ratios: Mapping[StageKey, float], key: StageKey) -> float | None:
    """The lower median of the other stages' ratios (None when no other stage has one)."""
    rest = [r for k, r in ratios.items() if k != key]
    return statistics.median_low(rest) if rest else None

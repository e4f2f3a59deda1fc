"""Straggler detection: a stage that runs persistently slower than its baseline.

Each (replica, stage) has a baseline compute time: the cost model's prediction when the planner
gave one, else the median of its first ``window`` measured steps after launch (skipping
``warmup_steps``). A stage is a straggler when each of its last ``window`` measurements exceeds
the baseline by more than ``threshold`` (1.3 = 30 % slower); its measured slowdown is the median
ratio over the window. One slow step (a GC pause, a checkpoint) never triggers.

The other way round, a stage that speeds up (a throttled device that cooled down) is judged
against what it *measured* (the median of its first ``window`` steps after launch, or the speed
accepted by :meth:`StragglerDetector.rebase`), never against a prediction, which may be off by
more than the threshold: :meth:`StragglerDetector.speedups` names the stages whose every one of
the last ``window`` measurements is below that by more than ``threshold``.
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
    """A stage found persistently slow, with the factor it is slower by."""

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
    factor: float  # measured now / measured before
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
        """Record one step's timings; return the stages that are now persistently slow."""
        found = []
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
            recent = self._recent.setdefault(key, deque(maxlen=self.window))
            recent.append(t.compute_s)
            straggler = self._judge(key, t.device_type, recent)
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
        """Stages (of ``keys``, or all) persistently faster than they measured before."""
        found = []
        for key, latest in sorted(self._latest.items()):
            before = self.measured_s.get(key)
            if (keys is not None and key not in keys) or before is None or before <= 0:
                continue
            if len(latest) < self.window or max(latest) * self.threshold >= before:
                continue
            now = statistics.median(latest)
            found.append(Speedup(key[0], key[1], self._types[key], now / before, before, now))
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

    def _judge(self, key: StageKey, device_type: str, recent: deque[float]) -> Straggler | None:
        baseline = self.baseline_s[key]
        if len(recent) < self.window or baseline <= 0:
            return None
        if min(recent) <= baseline * self.threshold:
            return None
        measured = statistics.median(recent)
        return Straggler(
            replica=key[0],
            stage=key[1],
            device_type=device_type,
            slowdown_factor=measured / baseline,
            baseline_s=baseline,
            measured_s=measured,
        )

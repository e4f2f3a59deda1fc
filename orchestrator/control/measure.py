"""What the controller measures while a plan runs: step times, calibration and switch cost.

The calibration is measured / predicted step time over the first healthy steps after a launch
(the warm-up step left out); it scales a candidate plan's prediction in the switch rule. The
switch cost is how long a switch kept the run from training: from the moment the controller began
the switch to the end of the new plan's first step, less one expected step. Switches that kept
every worker (re-formed in place, joiners warmed beforehand) and launches that started workers
are told apart: once one of the first kind was measured, the estimate is their mean, since a
warmed join pays only that kind; before, it is the mean of all.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass
class PlanMeasurements:
    """Step times of the plan now running."""

    predicted_step_s: float
    calibration_steps: int = 3
    recent_window: int = 10
    steps_seen: int = 0
    _calibration_samples: list[float] = field(default_factory=list)
    _recent_s: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._recent_s = deque(maxlen=self.recent_window)

    def observe(self, step_duration_s: float) -> None:
        self.steps_seen += 1
        if self.steps_seen == 1:
            return  # warm-up: first step after a launch
        self._recent_s.append(step_duration_s)
        if len(self._calibration_samples) < self.calibration_steps:
            self._calibration_samples.append(step_duration_s)

    @property
    def calibration(self) -> float:
        """Measured / predicted over the first healthy steps; 1.0 until one is measured."""
        if not self._calibration_samples or self.predicted_step_s <= 0:
            return 1.0
        return statistics.median(self._calibration_samples) / self.predicted_step_s

    @property
    def recent_steps(self) -> int:
        """How many steps (past the warm-up) :attr:`current_step_s` is the median of."""
        return len(self._recent_s)

    @property
    def current_step_s(self) -> float:
        """Median of the recent steps, or the calibrated prediction before any were measured."""
        if self._recent_s:
            return statistics.median(self._recent_s)
        return self.predicted_step_s * self.calibration


@dataclass
class SwitchCostMeter:
    """Mean of the measured switch costs, or the configured guess before the first one."""

    initial_estimate_s: float
    observations_s: list[float] = field(default_factory=list)
    in_place_s: list[float] = field(default_factory=list)  # those that started no worker
    _began_s: float | None = None
    _in_place: bool = False

    def begin(self, now_s: float) -> None:
        """A switch (or the first launch) started at ``now_s``; first call wins until finished."""
        if self._began_s is None:
            self._began_s = now_s

    def cancel(self) -> None:
        self._began_s = None

    def launched(self, *, in_place: bool) -> None:
        """The switch being measured kept every worker (``in_place``) or started some."""
        self._in_place = in_place

    def first_step_done(self, now_s: float, expected_step_s: float) -> float | None:
        """The new plan's first step ended at ``now_s``; returns the cost it measured."""
        if self._began_s is None:
            return None
        cost_s = max(0.0, now_s - self._began_s - expected_step_s)
        self.observations_s.append(cost_s)
        if self._in_place:
            self.in_place_s.append(cost_s)
        self._began_s, self._in_place = None, False
        return cost_s

    @property
    def estimate_s(self) -> float:
        """Mean of the in-place switches measured, else of all, else the configured guess."""
        if self.in_place_s:
            return statistics.fmean(self.in_place_s)
        if not self.observations_s:
            return self.initial_estimate_s
        return statistics.fmean(self.observations_s)

"""The switch rule: move to a new plan only when it pays for itself before the run ends.

With the current plan measured at ``current_step_s`` seconds per step and a candidate predicted
at ``candidate_predicted_step_s``, the candidate's expected step time is its prediction scaled by
how far the cost model was off for the current plan while it ran healthy (the *calibration*,
measured / predicted over the first steps after launch)::

    expected_new_s = candidate_predicted_step_s * calibration
    gain_s         = (current_step_s - expected_new_s) * remaining_steps
    switch        <=> gain_s > switch_threshold * switch_cost_s

``switch_cost_s`` is measured: the time the last switches took from stopping the old workers to
the new plan's first step, beyond a normal step. Example: 1.0 s/step now, candidate predicted
0.5 s with calibration 1.2 (expected 0.6 s), 200 steps left: gain 80 s; with a measured switch
cost of 20 s and threshold 1.0 the controller switches; with 20 steps left (gain 8 s) it does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.errors import SpecError


@dataclass(frozen=True)
class ReplanDecision:
    """Switch to the candidate plan at the next step boundary."""

    reason: str
    gain_s: float
    cost_s: float
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class NoopDecision:
    """Keep the current plan; ``numbers`` shows why."""

    reason: str
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplanPolicy:
    """The switch rule with its one knob: how many times the cost the gain must reach."""

    switch_threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.switch_threshold < 0:
            raise SpecError(
                f"switch_threshold is {self.switch_threshold}",
                field="elasticity.switch_threshold",
                fix="use 0 (switch on any gain) or more; 1.0 means gain must exceed the cost",
            )

    def decide(
        self,
        *,
        trigger: str,
        current_step_s: float,
        candidate_predicted_step_s: float,
        calibration: float,
        remaining_steps: int,
        switch_cost_s: float,
    ) -> ReplanDecision | NoopDecision:
        """Apply the switch rule; ``trigger`` ("join", "straggler") goes into the reason."""
        expected_new_s = candidate_predicted_step_s * calibration
        gain_s = (current_step_s - expected_new_s) * max(0, remaining_steps)
        numbers = {
            "current_step_s": current_step_s,
            "candidate_predicted_step_s": candidate_predicted_step_s,
            "calibration": calibration,
            "expected_new_step_s": expected_new_s,
            "remaining_steps": float(remaining_steps),
            "gain_s": gain_s,
            "switch_cost_s": switch_cost_s,
            "switch_threshold": self.switch_threshold,
        }
        if gain_s > self.switch_threshold * switch_cost_s:
            return ReplanDecision(
                reason=(
                    f"{trigger}: gain {gain_s:.1f} s over {remaining_steps} steps > "
                    f"{self.switch_threshold:g} x switch cost {switch_cost_s:.1f} s"
                ),
                gain_s=gain_s,
                cost_s=switch_cost_s,
                numbers=numbers,
            )
        return NoopDecision(
            reason=(
                f"{trigger}: gain {gain_s:.1f} s over {remaining_steps} steps <= "
                f"{self.switch_threshold:g} x switch cost {switch_cost_s:.1f} s; keeping the plan"
            ),
            numbers=numbers,
        )

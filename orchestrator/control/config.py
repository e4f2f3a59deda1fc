"""Controller settings: the job spec's ``elasticity`` section and the config built from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt

from orchestrator.errors import SpecError
from orchestrator.policies.failure import FailurePolicy
from orchestrator.policies.preemption import PreemptionPolicy
from orchestrator.policies.replan import ReplanPolicy


class ElasticitySpec(BaseModel):
    """What a user writes under ``elasticity:`` in a job file (see docs/controller.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_devices: PositiveInt = 1
    max_failures: NonNegativeInt = 5
    initial_backoff_s: NonNegativeFloat = 1.0
    backoff_multiplier: float = Field(default=2.0, ge=1.0)
    max_backoff_s: NonNegativeFloat = 30.0
    # A failure this long after the previous one starts the backoff over (policies/failure.py).
    backoff_reset_after_s: NonNegativeFloat = 600.0
    # The gain over the remaining steps must exceed this many times the measured switch cost.
    switch_threshold: NonNegativeFloat = 1.0
    # Used until the first switch (or the first launch) has been measured.
    initial_switch_cost_s: NonNegativeFloat = 10.0
    poll_interval_s: float = Field(default=1.0, gt=0)
    discovery_timeout_s: float = Field(default=300.0, gt=0)
    straggler_threshold: float = Field(default=1.3, gt=1.0)
    straggler_window_steps: PositiveInt = 5
    # A failed or evacuated node listed healthy this long is planned on again.
    rejoin_cooldown_s: NonNegativeFloat = 60.0

    def to_config(self, *, total_steps: int, checkpoint_interval_steps: int) -> ControllerConfig:
        """The controller's config for a run of ``total_steps`` steps."""
        return ControllerConfig(
            total_steps=total_steps,
            checkpoint_interval_steps=checkpoint_interval_steps,
            min_devices=self.min_devices,
            poll_interval_s=self.poll_interval_s,
            discovery_timeout_s=self.discovery_timeout_s,
            initial_switch_cost_s=self.initial_switch_cost_s,
            straggler_threshold=self.straggler_threshold,
            straggler_window_steps=self.straggler_window_steps,
            rejoin_cooldown_s=self.rejoin_cooldown_s,
            failure=FailurePolicy(
                max_failures=self.max_failures,
                initial_backoff_s=self.initial_backoff_s,
                backoff_multiplier=self.backoff_multiplier,
                max_backoff_s=self.max_backoff_s,
                reset_after_s=self.backoff_reset_after_s,
            ),
            replan=ReplanPolicy(switch_threshold=self.switch_threshold),
        )


@dataclass(frozen=True)
class ControllerConfig:
    """Everything the controller's decisions depend on, besides what it measures."""

    total_steps: int
    checkpoint_interval_steps: int = 50  # 0: no periodic checkpoints (one at the end only)
    min_devices: int = 1
    poll_interval_s: float = 1.0
    discovery_timeout_s: float = 300.0
    initial_switch_cost_s: float = 10.0
    straggler_threshold: float = 1.3
    straggler_window_steps: int = 5
    rejoin_cooldown_s: float = 60.0  # see policies/rejoin.py
    # Steps after a launch whose times set the calibration (measured / predicted); the first
    # step after a launch is warm-up and is left out.
    calibration_steps: int = 3
    failure: FailurePolicy = field(default_factory=FailurePolicy)
    replan: ReplanPolicy = field(default_factory=ReplanPolicy)
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)

    def __post_init__(self) -> None:
        if self.total_steps < 0:
            raise SpecError(
                f"total_steps is {self.total_steps}", field="steps", fix="use 0 or more steps"
            )
        if self.checkpoint_interval_steps < 0:
            raise SpecError(
                f"checkpoint interval is {self.checkpoint_interval_steps}",
                field="checkpoint.interval_steps",
                fix="use 0 (only at the end) or a positive number of steps",
            )

"""Controller settings: the config built from the job spec's ``elasticity`` section."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.errors import SpecError
from orchestrator.policies.failure import FailurePolicy
from orchestrator.policies.preemption import PreemptionPolicy
from orchestrator.policies.replan import ReplanPolicy
from orchestrator.spec.elasticity import ElasticitySpec


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
    # Slow nodes left without work: tried again after a cool-down (policies/readmit.py).
    readmit_cooldown_s: float = 60.0
    readmit_backoff: float = 2.0
    readmit_max_cooldown_s: float = 1800.0
    # Steps after a launch whose times set the calibration (measured / predicted); the first
    # step after a launch is warm-up and is left out.
    calibration_steps: int = 3
    failure: FailurePolicy = field(default_factory=FailurePolicy)
    replan: ReplanPolicy = field(default_factory=ReplanPolicy)
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)

    @classmethod
    def from_spec(
        cls, spec: ElasticitySpec, *, total_steps: int, checkpoint_interval_steps: int
    ) -> ControllerConfig:
        """The controller's config for a run of ``total_steps`` steps with ``spec``'s settings."""
        return cls(
            total_steps=total_steps,
            checkpoint_interval_steps=checkpoint_interval_steps,
            min_devices=spec.min_devices,
            poll_interval_s=spec.poll_interval_s,
            discovery_timeout_s=spec.discovery_timeout_s,
            initial_switch_cost_s=spec.initial_switch_cost_s,
            straggler_threshold=spec.straggler_threshold,
            straggler_window_steps=spec.straggler_window_steps,
            rejoin_cooldown_s=spec.rejoin_cooldown_s,
            readmit_cooldown_s=spec.readmit_cooldown_s,
            readmit_backoff=spec.readmit_backoff,
            readmit_max_cooldown_s=spec.readmit_max_cooldown_s,
            failure=FailurePolicy(
                max_failures=spec.max_failures,
                initial_backoff_s=spec.initial_backoff_s,
                backoff_multiplier=spec.backoff_multiplier,
                max_backoff_s=spec.max_backoff_s,
                reset_after_s=spec.backoff_reset_after_s,
                stable_steps=spec.backoff_reset_after_stable_steps,
                stable_s=spec.backoff_reset_after_stable_s,
            ),
            replan=ReplanPolicy(switch_threshold=spec.switch_threshold),
        )

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

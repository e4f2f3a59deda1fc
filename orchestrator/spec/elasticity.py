"""The job spec's ``elasticity`` section: how the controller adapts (see docs/controller.md).

Plain validated settings; :meth:`orchestrator.control.config.ControllerConfig.from_spec` turns
them into the controller's config and policies.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt


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
    # ... and so does one after the previous recovery trained this many steps and seconds.
    backoff_reset_after_stable_steps: NonNegativeInt = 20
    backoff_reset_after_stable_s: NonNegativeFloat = 10.0
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
    # A node planned as slow that a re-plan left without work is tried again at its labelled
    # speed after this long; each try that finds it still slow multiplies the wait by
    # ``readmit_backoff``, up to ``readmit_max_cooldown_s`` (policies/readmit.py).
    readmit_cooldown_s: NonNegativeFloat = 60.0
    readmit_backoff: float = Field(default=2.0, ge=1.0)
    readmit_max_cooldown_s: NonNegativeFloat = 1800.0

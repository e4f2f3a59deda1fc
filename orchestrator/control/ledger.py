"""The run's facts that outlive any one state: steps, failures, measurements, excluded nodes.

States carry what their next transition needs; the ledger carries what the whole run has learnt.
Only the controller's handlers (``control/starting.py``, ``control/running.py``) and
:class:`~orchestrator.control.context.RunContext` write it; everything else reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.control.measure import PlanMeasurements, SwitchCostMeter
from orchestrator.control.ports import PlanProposal
from orchestrator.policies.straggler import StragglerDetector
from orchestrator.spec.snapshot import ClusterSnapshot


@dataclass
class RunLedger:
    """What the run knows so far (steps are counted from 0: ``next_step`` is committed steps)."""

    switch_cost: SwitchCostMeter
    next_step: int = 0
    failure_count: int = 0
    lost_steps_total: int = 0
    last_checkpoint_step: int | None = None
    burst_count: int = 0  # failures of the current burst (see policies/failure.py)
    last_failure_s: float = float("-inf")
    # (time, committed steps) at the first step after the latest recovery; None until it commits.
    recovered_at: tuple[float, int] | None = None
    # Not planned on until they rejoin (policies/rejoin.py).
    excluded_nodes: set[str] = field(default_factory=set)
    slowdown_by_node: dict[str, float] = field(default_factory=dict)
    proposal: PlanProposal | None = None  # the plan the workers run (or last ran)
    measurements: PlanMeasurements = field(default_factory=lambda: PlanMeasurements(0.0))
    stragglers: StragglerDetector = field(default_factory=StragglerDetector)
    snapshot: ClusterSnapshot | None = None  # the latest probe
    last_poll_s: float = float("-inf")
    emulated: bool | None = None  # as last told to the callbacks
    last_infeasible_nodes: frozenset[str] = frozenset()  # usable nodes when no plan fit
    pending_recovery: tuple[str, float] | None = None  # (cause, failure seen at)
    overflow_skipped_total: int = 0  # fp16 steps whose update was skipped (run again)
    consecutive_overflows: int = 0
    last_lost_steps: int = 0  # lost steps of the restore behind the pending recovery

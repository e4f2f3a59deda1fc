"""Policies: when to change course. Each one is handed numbers and returns a decision as data.

Policies never query Ray or the clock themselves; the controller passes them what they need and
acts on what they return, so they are tested with literal numbers.
"""

from orchestrator.policies.failure import FailureDecision, FailurePolicy, GiveUp, Retry
from orchestrator.policies.preemption import (
    Evacuate,
    PreemptionDecision,
    PreemptionPolicy,
    TreatAsLost,
)
from orchestrator.policies.replan import NoopDecision, ReplanDecision, ReplanPolicy
from orchestrator.policies.straggler import Speedup, StageKey, Straggler, StragglerDetector

__all__ = [
    "Evacuate",
    "FailureDecision",
    "FailurePolicy",
    "GiveUp",
    "NoopDecision",
    "PreemptionDecision",
    "PreemptionPolicy",
    "ReplanDecision",
    "ReplanPolicy",
    "Retry",
    "Speedup",
    "StageKey",
    "Straggler",
    "StragglerDetector",
    "TreatAsLost",
]

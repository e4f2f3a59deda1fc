"""Preemption notices: a node that will go away at a deadline.

While the node is still up its state can be read, so the controller evacuates at once (reads
every layer from the workers, the draining node included, and re-plans without it). Once the
deadline has passed the node is as good as dead: treat it as a failure and restore from
surviving replicas or the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Evacuate:
    """Move state off ``node_ids`` now; ``slack_s`` is the time left before the earliest deadline
    (``None``: no deadline given)."""

    node_ids: tuple[str, ...]
    slack_s: float | None


@dataclass(frozen=True)
class TreatAsLost:
    """The deadline has passed (or is too close to read state in time)."""

    node_ids: tuple[str, ...]
    overdue_s: float


PreemptionDecision = Evacuate | TreatAsLost


@dataclass(frozen=True)
class PreemptionPolicy:
    """``safety_margin_s``: evacuation must be able to start this long before the deadline."""

    safety_margin_s: float = 0.0

    def decide(self, now_s: float, deadlines_s: dict[str, float | None]) -> PreemptionDecision:
        """Decide for the nodes in ``deadlines_s`` (node id -> deadline, ``None`` if unknown)."""
        nodes = tuple(sorted(deadlines_s))
        known = [d for d in deadlines_s.values() if d is not None]
        if not known:
            return Evacuate(node_ids=nodes, slack_s=None)
        slack_s = min(known) - now_s - self.safety_margin_s
        if slack_s <= 0:
            return TreatAsLost(node_ids=nodes, overdue_s=-slack_s)
        return Evacuate(node_ids=nodes, slack_s=slack_s)

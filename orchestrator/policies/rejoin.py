"""When an excluded node may be planned on again.

A node that failed (or was evacuated) is excluded from plans. It is not excluded forever: a node
that comes back (a NotReady blip, a restarted raylet keeping its id) and stays listed as alive and
not draining for ``cooldown_s`` is admitted again, and the controller treats it as a join (the
switch rule decides whether to use it). Leaving the cluster again restarts its cool-down.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field


@dataclass
class RejoinPolicy:
    cooldown_s: float = 60.0
    seen_back_s: dict[str, float] = field(default_factory=dict)  # excluded node -> listed since

    def readmit(self, excluded: Set[str], healthy: Set[str], now_s: float) -> list[str]:
        """Excluded nodes listed healthy for ``cooldown_s`` by ``now_s`` (forgotten here)."""
        for node in list(self.seen_back_s):
            if node not in excluded or node not in healthy:
                del self.seen_back_s[node]
        for node in excluded & healthy:
            self.seen_back_s.setdefault(node, now_s)
        back = sorted(n for n, t in self.seen_back_s.items() if now_s - t >= self.cooldown_s)
        for node in back:
            del self.seen_back_s[node]
        return back

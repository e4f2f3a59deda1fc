"""Local multi-node Ray clusters (``ray.cluster_utils.Cluster``): health checks and node crashes.

Used by the demo, the benchmarks and the tests, which run many Ray nodes on one machine.

A crash must look like a machine failure: every process of the node dies at once.
``Cluster.remove_node(node, allow_graceful=False)`` SIGKILLs the node's own daemons (raylet, object
store, agents) but not the Ray workers the raylet started: they notice their raylet is gone only
later, and on a fast job can finish several more training steps first, which no dead machine
does. :func:`crash_node` therefore SIGKILLs the workers too (every process descended from the
node's raylet, found through ``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Ray's defaults declare a crashed node dead after ~15 s; these after ~1.4 s (a raylet that
# answers at all answers in milliseconds, even on a busy 2-core host).
FAST_HEALTH_CHECKS: Mapping[str, str] = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_timeout_ms": "500",
}


def _parent_pids(proc: Path = Path("/proc")) -> dict[int, int]:
    """pid -> parent pid of every process visible in ``/proc``."""
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        # Fields after the command name (which may hold spaces) start after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parent_pids().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _raylet_pid(node: Any) -> int | None:
    infos = node.all_processes.get("raylet") or []
    return infos[0].process.pid if infos else None


def crash_node(cluster: Any, node: Any) -> list[int]:
    """SIGKILL every process of ``node`` (its workers too); returns the workers' pids."""
    raylet = _raylet_pid(node)
    workers = descendants(raylet) if raylet is not None else []
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    cluster.remove_node(node, allow_graceful=False)
    return workers

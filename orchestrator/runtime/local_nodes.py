"""Local multi-node Ray clusters (``ray.cluster_utils.Cluster``): health checks and node crashes.

Used by the demo, the benchmarks and the tests, which run many Ray nodes on one machine.

A crash must look like a machine failure: every process of the node dies at once.
``Cluster.remove_node(node, allow_graceful=False)`` SIGKILLs the node's own daemons (raylet, object
store, agents) but not the Ray workers the raylet started: they notice their raylet is gone only
later, and on a fast job can finish several more training steps first, which no dead machine
does. :func:`crash_node` therefore SIGKILLs the workers too (every process descended from the
node's raylet, found through ``/proc``).

A new node boots on the same cores as the nodes already training, which no new machine does: its
raylet, Ray's agents, its actor's process start, ``import torch`` and the engine build take CPU
from the training ranks. :func:`booting_at_low_priority` emulates *the new machine booting on its
own CPU*: the node's processes start at ``nice`` 19 (they get only the CPU the training leaves),
and the node's environment says so (``EMULATED_BOOT_ENV``); the first time an actor there starts
to train (:func:`end_emulated_boot`, called by the elastic worker) it raises its own process and
its raylet back to the priority the cluster's driver had. Emulation only: nothing lowers a
priority on a real node, the flag is set only by this module for the local cluster's nodes, and
:func:`end_emulated_boot` does nothing where a real GPU is present. It needs the right to raise a
priority back (root or ``RLIMIT_NICE``); without it nothing is lowered at all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# Ray's defaults declare a crashed node dead after ~15 s; these after ~1.4 s (a raylet that
# answers at all answers in milliseconds, even on a busy 2-core host).
FAST_HEALTH_CHECKS: Mapping[str, str] = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_timeout_ms": "500",
}


# Set in a node's environment when its processes started at low priority to emulate a new machine
# booting on its own CPU; the value is the nice its training should run at.
EMULATED_BOOT_ENV = "ORCHESTRATOR_EMULATED_BOOT_TRAIN_NICE"
BOOT_NICE = 19


def may_raise_priority(to_nice: int) -> bool:
    """Whether this process may set a thread back to ``to_nice`` after lowering it (root, or an
    ``RLIMIT_NICE`` that allows it)."""
    if not hasattr(os, "setpriority"):
        return False
    if os.geteuid() == 0:
        return True
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or 20 - soft <= to_nice


@contextlib.contextmanager
def booting_at_low_priority(nice: int = BOOT_NICE) -> Iterator[bool]:
    """Processes started inside run at ``nice`` and carry :data:`EMULATED_BOOT_ENV` (emulation:
    see the module docstring). Yields whether it applied (False: this process could not raise
    its priority back afterwards, so nothing was lowered). Call from the thread that starts the
    node; Linux keeps nice per thread and a child inherits the forking thread's."""
    tid = threading.get_native_id()
    mine = os.getpriority(os.PRIO_PROCESS, tid) if hasattr(os, "getpriority") else 0
    if nice <= mine or not may_raise_priority(mine):
        yield False
        return
    before_env = os.environ.get(EMULATED_BOOT_ENV)
    os.environ[EMULATED_BOOT_ENV] = str(mine)
    os.setpriority(os.PRIO_PROCESS, tid, nice)
    try:
        yield True
    finally:
        os.setpriority(os.PRIO_PROCESS, tid, mine)
        if before_env is None:
            os.environ.pop(EMULATED_BOOT_ENV, None)
        else:
            os.environ[EMULATED_BOOT_ENV] = before_env


def set_process_nice(pid: int, nice: int, proc: Path = Path("/proc")) -> int:
    """Set every thread of ``pid`` to ``nice``; how many threads were set."""
    done = 0
    try:
        tids = [int(t.name) for t in (proc / str(pid) / "task").iterdir()]
    except OSError:  # the process ended
        return 0
    for tid in tids:
        with contextlib.suppress(OSError):  # the thread ended, or not permitted
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            done += 1
    return done


def end_emulated_boot() -> int | None:
    """This actor starts to train on a node whose processes booted at low priority (emulation):
    raise this process's threads and its raylet's (its parent) to the nice the node's
    environment names, once. Returns that nice, or None where there was nothing to do (not an
    emulated boot, already done, or a real GPU here)."""
    target = os.environ.pop(EMULATED_BOOT_ENV, None)
    if target is None:
        return None
    from orchestrator.runtime.actor import has_real_gpu

    if has_real_gpu():  # never on real devices
        return None
    nice = int(target)
    set_process_nice(os.getpid(), nice)
    set_process_nice(os.getppid(), nice)  # the raylet: it schedules and moves this node's objects
    return nice


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

"""Work that must not slow the training beside it: run on a thread at the lowest CPU priority.

A joiner's warm-up (``import torch``, building its rank's engine) happens while the current plan
trains. Where the joiner shares CPUs with training ranks (several emulated nodes on one host, a
node whose CPUs also feed a training GPU) the warm-up's seconds of CPU came out of the training
steps. Run at ``nice`` 19 it takes only the CPU time the training leaves idle.

Why a thread and not the actor's process: Linux keeps a nice value per thread, and an
unprivileged process cannot raise its priority back (that needs ``CAP_SYS_NICE``). A niced
actor process would train at that priority after the switch; a niced thread that ends when the
warm-up ends leaves the actor's other threads, which train, at their own priority. Threads the
warm-up starts inherit its nice; with one intra-op thread per actor (Ray sets
``OMP_NUM_THREADS`` to the actor's CPUs) torch runs its work on the calling thread, and the
process groups, whose threads live on, are only joined at the switch, on the actor's own thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

LOWEST_NICE = 19
_RUNNING: set[int] = set()  # native ids of the low-priority threads at work


def hurry() -> bool:
    """Give the low-priority work still running the calling thread's priority, where this
    process may (root or ``CAP_SYS_NICE``): something now waits for it (a switch that could
    not wait for the warm-up to finish). Whether every such thread was raised."""
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return False
    ok = True
    try:
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except OSError:
        return False
    for tid in list(_RUNNING):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, mine)
        except OSError:  # not permitted, or the thread just ended
            ok = False
    return ok


def run_at_low_priority(work: Callable[[], T], nice: int = LOWEST_NICE) -> tuple[T, int | None]:
    """``work()`` on a new thread niced to ``nice``; its result (its exception is raised here)
    and the nice it ran at (None where the platform has no per-thread priority)."""
    out: dict[str, object] = {}

    def body() -> None:
        out["nice"] = _lower_this_thread(nice)
        _RUNNING.add(threading.get_native_id())
        try:
            out["result"] = work()
        except BaseException as exc:  # raised again on the caller's thread
            out["error"] = exc
        finally:
            _RUNNING.discard(threading.get_native_id())

    thread = threading.Thread(target=body, name="low-priority-work", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["result"], out["nice"]  # type: ignore[return-value]


def _lower_this_thread(nice: int) -> int | None:
    """Lower the calling thread's priority to ``nice`` (Linux: per thread); the nice now."""
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return None
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None

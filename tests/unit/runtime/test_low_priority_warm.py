"""The joiner's warm-up runs on a thread at the lowest CPU priority, and only that thread."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from orchestrator.runtime.elastic.background import LOWEST_NICE, hurry, run_at_low_priority

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")


def _my_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_the_work_runs_niced_on_its_own_thread_and_the_caller_keeps_its_priority():
    before = _my_nice()
    seen = {}

    def work():
        seen["thread"] = threading.get_native_id()
        seen["nice"] = _my_nice()
        return "built"

    result, nice = run_at_low_priority(work)
    assert result == "built"
    assert seen["thread"] != threading.get_native_id()
    assert seen["nice"] == nice == max(before, LOWEST_NICE)
    assert _my_nice() == before  # the thread that trains later is not niced


def test_an_error_in_the_work_is_raised_on_the_caller():
    def work():
        raise ValueError("engine could not be built")

    with pytest.raises(ValueError, match="engine could not be built"):
        run_at_low_priority(work)


def test_hurry_raises_running_work_back_where_permitted():
    started, release, seen = threading.Event(), threading.Event(), {}

    def work():
        started.set()
        release.wait(10)
        seen["nice"] = _my_nice()

    t = threading.Thread(target=run_at_low_priority, args=(work,))
    t.start()
    started.wait(10)
    raised = hurry()
    release.set()
    t.join(10)
    if raised:  # root or CAP_SYS_NICE: back at the caller's priority
        assert seen["nice"] == _my_nice()
    else:  # unprivileged: it finishes at low priority
        assert seen["nice"] == max(_my_nice(), LOWEST_NICE)

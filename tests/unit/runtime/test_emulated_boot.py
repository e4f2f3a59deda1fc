"""An emulated node's processes boot at low priority and train at the driver's priority: the
local cluster's emulation of a new machine booting on its own CPU (runtime/local_nodes.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from orchestrator.runtime.local_nodes import (
    BOOT_NICE,
    EMULATED_BOOT_ENV,
    booting_at_low_priority,
    may_raise_priority,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")

CHILD = (
    "import os, sys; from orchestrator.runtime.local_nodes import end_emulated_boot; "
    "before = os.getpriority(os.PRIO_PROCESS, 0); env = os.environ.get(sys.argv[1]); "
    "after = end_emulated_boot(); "
    "print(before, env, after, os.getpriority(os.PRIO_PROCESS, 0), end_emulated_boot())"
)


def _my_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _child() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, EMULATED_BOOT_ENV],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )


def test_a_node_started_booting_runs_niced_until_it_trains_and_the_driver_keeps_its_priority():
    mine = _my_nice()
    with booting_at_low_priority() as applied:
        child = _child()
    out, _ = child.communicate(timeout=120)
    assert _my_nice() == mine  # the driver's thread is back at its priority
    assert EMULATED_BOOT_ENV not in os.environ
    before, env, after, trained_at, again = out.split()
    if may_raise_priority(mine):
        assert applied
        # Booted at nice 19 with the flag; the first end_emulated_boot() raised it back to the
        # driver's nice, and a second one does nothing.
        assert (int(before), env, int(after), int(trained_at), again) == (
            max(BOOT_NICE, mine),
            str(mine),
            mine,
            mine,
            "None",
        )
    else:  # could not raise it back afterwards: nothing was lowered at all
        assert not applied
        assert (int(before), env, after) == (mine, "None", "None")


def test_a_process_started_normally_has_no_emulated_boot_to_end():
    child = _child()
    out, _ = child.communicate(timeout=120)
    before, env, after, trained_at, _ = out.split()
    assert env == "None" and after == "None" and int(trained_at) == int(before)

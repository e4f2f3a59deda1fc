"""An emulated device keeps its measured speed across the engines of one process
(``Stretcher.adopt_references``, used when a kept actor re-forms onto the same work) and across
the processes of one host running the same work (``SharedReferences``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.worker.emulation import SHARED_REFERENCES_ENV, SharedReferences, Stretcher


def _busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_new_stretcher_adopts_the_least_cpu_time_seen_before() -> None:
    earlier = Stretcher(4.0)
    earlier.run(lambda: _busy(0.01), key="forward")
    least = earlier.reference_cpu_s("forward")
    assert least is not None
    later = Stretcher(4.0)
    later.adopt_references(earlier)
    later.reset()
    later.run(lambda: _busy(0.03), key="forward")  # slower now (a busy host): the least counts
    assert later.reference_cpu_s("forward") == least
    # Stretched from the adopted 0.01 s (about 0.04 s), not from this call's 0.03 s (0.12 s).
    assert later.compute_s < 4.0 * 0.03


def test_adopting_keeps_a_lower_time_of_its_own_and_keys_it_alone_has() -> None:
    earlier = Stretcher(2.0)
    earlier.run(lambda: _busy(0.02), key="forward")
    later = Stretcher(2.0)
    later.run(lambda: _busy(0.005), key="forward")
    later.run(lambda: _busy(0.005), key="update")
    own = later.reference_cpu_s("forward")
    later.adopt_references(earlier)
    assert later.reference_cpu_s("forward") == own
    assert later.reference_cpu_s("update") is not None


def test_a_process_starting_later_takes_the_times_shared_on_this_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SHARED_REFERENCES_ENV, str(tmp_path))
    first = Stretcher(4.0, SharedReferences.for_work("model x, layers 0-6"))
    first.run(lambda: _busy(0.01), key=("forward", 8))
    least = first.reference_cpu_s(("forward", 8))
    assert least is not None
    # Another process (a joiner) on the same work: the least time is its own from the start.
    joiner = Stretcher(4.0, SharedReferences.for_work("model x, layers 0-6"))
    joiner.run(lambda: _busy(0.03), key=("forward", 8))
    assert joiner.reference_cpu_s(("forward", 8)) == least
    # Other work shares nothing.
    other = Stretcher(4.0, SharedReferences.for_work("model x, layers 0-3"))
    other.run(lambda: _busy(0.03), key=("forward", 8))
    assert other.reference_cpu_s(("forward", 8)) > least


def test_nothing_is_shared_without_the_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHARED_REFERENCES_ENV, raising=False)
    assert SharedReferences.for_work("model x") is None

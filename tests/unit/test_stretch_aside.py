"""Work under ``Stretcher.aside`` inside a stretched call (the layer-by-layer sharded path's
collectives and buffers) is timed by the wall clock on top of the stretched compute, not
stretched with it, and its waits do not hide inside the emulated sleep."""

from __future__ import annotations

import time

from orchestrator.worker.emulation import Stretcher

FACTOR = 4.0
COMPUTE_CPU_S = 0.005
ASIDE_CPU_S = 0.03
ASIDE_WAIT_S = 0.03


def _burn(cpu_s: float) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_aside_work_is_added_at_its_wall_time_not_stretched() -> None:
    stretcher = Stretcher(FACTOR)

    def call() -> None:
        _burn(COMPUTE_CPU_S)
        with stretcher.aside():
            _burn(ASIDE_CPU_S)  # the buffers' CPU work
            time.sleep(ASIDE_WAIT_S)  # waiting for the other ranks

    started = time.perf_counter()
    stretcher.run(call, key=("forward", 1))
    took_s = time.perf_counter() - started
    # The compute stretched, the aside work on top at its own wall time: never less.
    floor_s = FACTOR * COMPUTE_CPU_S + ASIDE_CPU_S + ASIDE_WAIT_S
    assert stretcher.compute_s >= floor_s
    assert took_s >= floor_s
    # Stretched with the compute it would be FACTOR x all the CPU time (the wait hidden in the
    # sleep): 0.14 s here, against 0.08 s; only a host 1.75x overloaded reaches it.
    assert stretcher.compute_s < FACTOR * (COMPUTE_CPU_S + ASIDE_CPU_S)
    # The compute's reference CPU time leaves the aside work out.
    reference = stretcher.reference_cpu_s(("forward", 1))
    assert reference is not None and reference < COMPUTE_CPU_S + ASIDE_CPU_S / 2


def test_without_aside_the_call_is_stretched_whole() -> None:
    stretcher = Stretcher(FACTOR)
    stretcher.run(lambda: _burn(COMPUTE_CPU_S + ASIDE_CPU_S))
    assert stretcher.compute_s >= FACTOR * (COMPUTE_CPU_S + ASIDE_CPU_S)

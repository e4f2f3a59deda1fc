"""Work under ``Stretcher.aside`` inside a stretched call (the layer-by-layer sharded path's
collectives and buffers) is timed by the wall clock on top of the stretched compute, not
stretched with it, and its waits do not hide inside the emulated sleep."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

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
    # The compute's reference CPU time, the segment's before the aside block, leaves the aside
    # work out.
    reference = stretcher.reference_cpu_s((("forward", 1), "segment", 0))
    assert reference is not None and reference < COMPUTE_CPU_S + ASIDE_CPU_S / 2


def test_without_aside_the_call_is_stretched_whole() -> None:
    stretcher = Stretcher(FACTOR)
    stretcher.run(lambda: _burn(COMPUTE_CPU_S + ASIDE_CPU_S))
    assert stretcher.compute_s >= FACTOR * (COMPUTE_CPU_S + ASIDE_CPU_S)


def test_aside_starts_when_the_emulated_compute_before_it_would_end() -> None:
    stretcher = Stretcher(FACTOR)
    entered: list[float] = []

    def call() -> None:
        _burn(COMPUTE_CPU_S)
        with stretcher.aside():
            entered.append(time.perf_counter())

    started = time.perf_counter()
    stretcher.run(call, key=("forward", 1))
    # Paced: the collective starts when the emulated device would reach it, not after the
    # compute's CPU time alone.
    assert entered[0] - started >= 0.95 * FACTOR * COMPUTE_CPU_S


PEER_COMPUTE_CPU_S = 0.01
PEER_DELAY_S = 0.015  # under the slack (FACTOR - 1) x PEER_COMPUTE_CPU_S = 0.03 s


def _peer(rank: int, barrier: Any, out: Any) -> None:
    stretcher = Stretcher(FACTOR)

    def call() -> None:
        _burn(PEER_COMPUTE_CPU_S)
        if rank == 1:
            time.sleep(PEER_DELAY_S)  # the host delayed this rank: no CPU spent
        with stretcher.aside():
            barrier.wait()  # the collective both ranks meet at

    barrier.wait()  # start together: the processes' start-up differs
    stretcher.run(call)
    out.put((rank, stretcher.compute_s, stretcher.aside_s))


def test_a_peer_the_host_delays_does_not_hold_the_other_beyond_its_emulated_time() -> None:
    """Two ranks (processes) compute alike and meet at a collective; the host delays one by
    less than the emulated slack. Each rank's call then lasts its emulated compute, as on
    devices of their own; stretched only at the call's end, the other would wait the delay at
    the collective and have it added on top."""
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_peer, args=(rank, barrier, out)) for rank in range(2)]
    for proc in procs:
        proc.start()
    results = {rank: (c, a) for rank, c, a in (out.get(timeout=10) for _ in procs)}
    for proc in procs:
        proc.join(timeout=10)
    compute_s, aside_s = results[0]
    assert aside_s < PEER_DELAY_S / 2  # it did not wait for the delayed rank
    assert compute_s < FACTOR * PEER_COMPUTE_CPU_S + PEER_DELAY_S / 2

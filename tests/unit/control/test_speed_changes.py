"""A device whose speed changes while it runs: the emulated throttle, the detector's speed-ups,
and how a node is named when it is throttled."""

from __future__ import annotations

import time

import pytest

from orchestrator.errors import SpecError
from orchestrator.policies import StragglerDetector
from orchestrator.runtime.elastic.probe import resolve_node
from orchestrator.spec.reports import StageTiming
from orchestrator.worker.emulation import Stretcher


def _timings(*compute_s: float) -> tuple[StageTiming, ...]:
    return tuple(StageTiming(r, 0, "A100-80", c, 0.0) for r, c in enumerate(compute_s))


def _busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_throttle_stretches_later_work_on_top_of_the_labelled_speed():
    stretcher = Stretcher(2.0)
    stretcher.run(lambda: _busy(0.01), key="w")
    reference = stretcher.reference_cpu_s("w")
    assert reference is not None
    stretcher.reset()
    stretcher.throttle(3.0)
    assert stretcher.factor == pytest.approx(6.0) and stretcher.emulated
    stretcher.run(lambda: _busy(0.01), key="w")
    # The reference is the least CPU time seen, so this run may have lowered it: compare with
    # the reference the throttled run was stretched from, not the first run's.
    least = stretcher.reference_cpu_s("w")
    assert least is not None and least <= reference
    assert stretcher.compute_s >= 6.0 * least * 0.99
    stretcher.throttle(1.0)  # cooled down: the labelled speed again
    assert stretcher.factor == pytest.approx(2.0)


def test_a_throttle_on_a_full_speed_node_stretches_its_wall_time():
    stretcher = Stretcher(1.0)
    assert not stretcher.emulated
    stretcher.throttle(2.5)
    assert stretcher.emulated
    started = time.perf_counter()
    stretcher.run(lambda: time.sleep(0.02))  # waiting, not computing: wall time counts here
    took_s = time.perf_counter() - started
    assert stretcher.compute_s >= 2.5 * 0.02 and took_s >= 2.5 * 0.02
    stretcher.throttle(1.0)
    assert not stretcher.emulated


@pytest.mark.parametrize("bad", [0.5, 0.0, -1.0, float("nan")])
def test_a_throttle_below_one_is_refused_naming_the_fix(bad):
    stretcher = Stretcher(2.0)
    with pytest.raises(SpecError, match=r"factor.*fix: pass 1\.0"):
        stretcher.throttle(bad)
    assert stretcher.factor == 2.0


def test_a_stage_that_speeds_up_is_found_against_what_it_measured():
    detector = StragglerDetector(window=3, threshold=1.3)
    detector.baseline_s = {(0, 0): 0.5, (1, 0): 0.5}  # predictions: far off for replica 1
    detector.observe(_timings(1.0, 3.0))  # warm-up step
    for _ in range(3):
        detector.observe(_timings(1.0, 3.0))
    assert detector.measured_s == {(0, 0): 1.0, (1, 0): 3.0}
    for _ in range(2):
        detector.observe(_timings(1.0, 1.0))
    assert detector.speedups() == []  # two fast steps are not yet a window
    detector.observe(_timings(1.0, 1.0))
    (found,) = detector.speedups()
    assert (found.replica, found.stage) == (1, 0)
    assert found.factor == pytest.approx(1 / 3)
    assert detector.speedups(keys={(0, 0)}) == []  # only the stages asked about
    detector.rebase((1, 0), found.measured_s)
    assert detector.speedups() == []  # the new speed is the new normal: it fires once


def test_every_stage_speeding_up_alike_is_the_host_not_a_speed_up():
    detector = StragglerDetector(window=3, threshold=1.3)
    for _ in range(4):  # warm-up step, then the measured window: 2 s each, the host busy
        detector.observe(_timings(2.0, 2.0, 2.0))
    for _ in range(5):  # the host quiet again: every stage twice as fast
        detector.observe(_timings(1.0, 1.0, 1.0))
    assert detector.speedups() == []
    for _ in range(3):  # now one stage alone speeds up on top of that
        detector.observe(_timings(1.0, 0.25, 1.0))
    (found,) = detector.speedups()
    assert (found.replica, found.factor) == (1, pytest.approx(0.25))


def test_a_stage_alone_is_judged_against_what_it_measured():
    detector = StragglerDetector(window=3, threshold=1.3)
    for c in (3.0, 3.0, 3.0, 3.0, 1.0, 1.0, 1.0):
        detector.observe(_timings(c))
    (found,) = detector.speedups()
    assert found.factor == pytest.approx(1 / 3)


def test_a_small_speed_up_within_the_threshold_is_noise():
    detector = StragglerDetector(window=3, threshold=1.3)
    for c in (2.0, 2.0, 2.0, 2.0, 1.7, 1.7, 1.7):
        detector.observe(_timings(c))
    assert detector.speedups() == []


ROWS = [
    {"NodeID": "a1b2c3d4e5f6", "Alive": True, "NodeManagerHostname": "host-a", "Labels": {}},
    {"NodeID": "a1b2c3d4ffff", "Alive": True, "NodeManagerHostname": "host-b", "Labels": {}},
    {"NodeID": "deadbeef0000", "Alive": False, "NodeManagerHostname": "host-c", "Labels": {}},
]


def test_a_throttled_node_is_named_by_id_prefix_or_host_name():
    assert resolve_node("a1b2c3d4e5f6", lambda: ROWS) == "a1b2c3d4e5f6"
    assert resolve_node("a1b2c3d4e5", lambda: ROWS) == "a1b2c3d4e5f6"
    assert resolve_node("host-b", lambda: ROWS) == "a1b2c3d4ffff"


@pytest.mark.parametrize("name", ["a1b2c3d4", "host-c", "nowhere"])
def test_a_name_that_fits_no_single_alive_node_is_refused(name):
    with pytest.raises(SpecError, match=r"names no single alive Ray node.*fix:"):
        resolve_node(name, lambda: ROWS)

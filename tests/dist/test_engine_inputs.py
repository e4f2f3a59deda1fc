"""The engine refuses bad input before any process group exists, with one line naming the field."""

from __future__ import annotations

import pytest
from dist_cases import engine_config, make_plan

from orchestrator.errors import SpecError
from orchestrator.worker.emulation import Stretcher, parse_speed, slowdown_factor
from orchestrator.worker.engine import StageEngine, preflight

PLAN = make_plan([(4, [((0, 2), "A100"), ((2, 5), "T4")])])


def test_layer_count_mismatch_is_refused() -> None:
    config = engine_config(PLAN, model_kwargs={"num_layers": 5, "hidden_size": 32, "num_heads": 4})
    with pytest.raises(SpecError, match="plan covers 5 planner layers but model"):
        preflight(config)


def test_unknown_schedule_and_optimizer_are_refused() -> None:
    with pytest.raises(ValueError, match="'pipedream' is not a valid Schedule"):
        preflight(engine_config(PLAN, schedule="pipedream"))
    with pytest.raises(SpecError, match=r"training\.optimizer: unknown optimizer 'lamb'"):
        StageEngine(engine_config(PLAN, optimizer="lamb"))


def test_rank_outside_plan_and_wrong_world_size() -> None:
    with pytest.raises(SpecError, match="rank 2 outside the plan's 2 ranks"):
        StageEngine(engine_config(PLAN, rank=2))
    engine = StageEngine(engine_config(PLAN, rank=1))
    with pytest.raises(SpecError, match=r"world_size 3 != the plan's 2 stages"):
        engine.setup("127.0.0.1", 1, 3)


def test_engine_holds_only_its_layers() -> None:
    engine = StageEngine(engine_config(PLAN, rank=1))
    assert sorted(engine.get_layer_states()) == [2, 3, 4]
    assert engine.dataset is not None  # the last stage reads its targets
    with pytest.raises(SpecError, match=r"lack planner layers \[4\]"):
        engine.set_layer_states({2: {}, 3: {}})


def test_emulation_factors_from_labels() -> None:
    speed = parse_speed({"orchestrator.io/emulated-speed": "0.25"})
    assert slowdown_factor(speed, 1.0, gpu_present=False) == 4.0
    # never on a real GPU, never without a label
    assert slowdown_factor(speed, 1.0, gpu_present=True) == 1.0
    assert slowdown_factor(None, 1.0, gpu_present=False) == 1.0
    with pytest.raises(SpecError, match="must be a positive number"):
        parse_speed({"orchestrator.io/emulated-speed": "fast"})
    with pytest.raises(SpecError, match="only slow down"):
        Stretcher(0.5)


def _busy(seconds: float) -> None:
    """Burn CPU time on this thread."""
    import time

    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_stretcher_stretches_cpu_time() -> None:
    import time

    stretcher = Stretcher(3.0)
    start = time.perf_counter()
    stretcher.run(lambda: _busy(0.02))
    wall_s = time.perf_counter() - start
    assert stretcher.emulated
    # The call lasts factor x its CPU time: compute_s counts it and the wall clock saw it.
    assert stretcher.compute_s >= 3.0 * 0.02
    assert wall_s >= 3.0 * 0.02


def test_stretcher_stretches_the_least_cpu_time_seen_for_repeating_work() -> None:
    # A busy host inflates the CPU time of the same work; the reference is the least seen.
    stretcher = Stretcher(10.0)
    stretcher.run(lambda: _busy(0.03), key=("forward", 8))
    first = stretcher.reference_cpu_s(("forward", 8))
    assert first is not None and 0.03 <= first < 0.06
    stretcher.run(lambda: _busy(0.01), key=("forward", 8))
    second = stretcher.reference_cpu_s(("forward", 8))
    assert second is not None and 0.01 <= second < 0.03
    # More CPU time later does not raise it; another key has its own reference.
    stretcher.run(lambda: _busy(0.02), key=("forward", 8))
    assert stretcher.reference_cpu_s(("forward", 8)) == second
    assert stretcher.reference_cpu_s(("backward", 8)) is None
    # The reference survives a new step's reset.
    stretcher.reset()
    assert stretcher.compute_s == 0.0
    assert stretcher.reference_cpu_s(("forward", 8)) == second


def test_stretcher_ignores_time_the_host_spent_elsewhere() -> None:
    import time

    # Sleeping uses no CPU: an emulated device is not slowed by waits (or by other processes
    # taking the host's cores), only by its own work.
    stretcher = Stretcher(3.0)
    start = time.perf_counter()
    stretcher.run(lambda: time.sleep(0.05))
    wall_s = time.perf_counter() - start
    assert wall_s < 3.0 * 0.05
    assert stretcher.compute_s < 3.0 * 0.05

    # At real speed (factor 1) nothing is emulated: compute is what the clock saw.
    real = Stretcher(1.0)
    real.run(lambda: time.sleep(0.02))
    assert real.compute_s >= 0.02

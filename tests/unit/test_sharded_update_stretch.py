"""Emulation stretches a sharded holder's optimizer step on its slice, not the gather after it."""

from __future__ import annotations

import time
import types

from orchestrator.worker.emulation import Stretcher
from orchestrator.worker.engine import StageEngine
from orchestrator.worker.recipe import OptimizerRecipe


def _burn(cpu_s: float) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


class _Sharding:
    """Stands in for ShardedState: the slice update and the gather each burn CPU."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.slice_numels = (1000,)

    def update_slices(self, learning_rate: float | None = None) -> None:
        self.calls.append("update")
        _burn(0.002)

    def gather_updated(self, layers: object) -> None:
        self.calls.append("gather")
        _burn(0.02)

    def step(self, layers: object, learning_rate: float | None = None) -> None:
        self.update_slices(learning_rate)
        self.gather_updated(layers)


def _engine(skip: bool) -> types.SimpleNamespace:
    fake = types.SimpleNamespace(
        stretcher=Stretcher(16.0),
        sharding=_Sharding(),
        layers={},
        optimizers={},
        scaling=None,
        recipe=OptimizerRecipe(learning_rate=1e-3),
        _skip_update=skip,
        _step=0,
        _sync=lambda: None,
    )
    fake._update = types.MethodType(StageEngine._update, fake)
    fake._update_key = types.MethodType(StageEngine._update_key, fake)
    return fake


def test_the_gather_of_updated_slices_is_not_stretched() -> None:
    fake = _engine(skip=False)
    StageEngine.apply_update(fake)  # type: ignore[arg-type]
    assert fake.sharding.calls == ["update", "gather"]
    # 16 x the slice update's 2 ms of CPU (and its wall time), not 16 x the gather's 20 ms
    assert 16 * 0.002 <= fake.stretcher.compute_s < 16 * 0.008


def test_a_skipped_update_gathers_nothing() -> None:
    fake = _engine(skip=True)
    StageEngine.apply_update(fake)  # type: ignore[arg-type]
    assert fake.sharding.calls == []

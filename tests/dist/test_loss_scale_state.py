"""fp16's loss scale is part of the state a rank hands out: a checkpoint or a re-plan restores it,
so a resumed run continues at the scale it had (as GradScaler's state_dict does), not at the
initial one. One rank, a real gloo group of one, in this process."""

from __future__ import annotations

import math

from dist_cases import engine_config, make_plan

from orchestrator.worker.engine import StageEngine
from orchestrator.worker.local import free_port
from orchestrator.worker.precision import LOSS_SCALE_KEY

PLAN = make_plan([(4, [((0, 5), "A100")])])


def _engine(**overrides: float) -> StageEngine:
    engine = StageEngine(engine_config(PLAN, precision="fp16", **overrides))
    engine.setup("127.0.0.1", free_port(), world_size=1)
    return engine


def test_loss_scale_is_saved_with_the_layers_and_restored() -> None:
    # 2^40 overflows fp16 at once: the first steps are skipped and the scale backs off.
    first = _engine(loss_scale_init=2.0**40)
    try:
        results = [first.train_step(step) for step in range(3)]
        states = first.get_layer_states()
        scale_after = first.scaling.scale if first.scaling is not None else math.nan
    finally:
        first.shutdown()
    assert results[0].overflow_skipped
    assert scale_after < 2.0**40
    assert all(s[LOSS_SCALE_KEY]["scale"] == scale_after for s in states.values())

    resumed = _engine()  # default initial scale 2^16
    try:
        resumed.set_layer_states(states)
        step = resumed.train_step(3)
    finally:
        resumed.shutdown()
    assert step.loss_scale == scale_after

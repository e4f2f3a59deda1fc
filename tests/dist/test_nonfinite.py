"""A diverging run stops before its first non-finite update, on every rank alike (real gloo)."""

from __future__ import annotations

import pytest
from dist_cases import engine_config, make_plan
from torch.multiprocessing.spawn import ProcessRaisedException

from orchestrator.worker.local import run_local

# Two stages: the loss lives on rank 1 only, so rank 0 learns of it through the guard's all-reduce.
PLAN = make_plan([(4, [((0, 2), "A100"), ((2, 5), "T4")])])


def test_huge_learning_rate_stops_at_the_first_non_finite_step() -> None:
    config = engine_config(PLAN, optimizer="sgd", learning_rate=1e30)
    with pytest.raises(ProcessRaisedException) as info:
        run_local(config, range(6))
    text = str(info.value)
    assert "NonFiniteStepError" in text
    assert "non-finite" in text and "learning rate (1e+30) too high" in text


def test_finite_run_is_unchanged_by_the_guard() -> None:
    run = run_local(engine_config(PLAN, optimizer="sgd", learning_rate=1e-3), range(2))
    losses = [r.loss for r in run.results[1]]
    assert all(loss is not None and loss > 0 for loss in losses)

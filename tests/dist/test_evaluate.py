"""Validation loss through a plan: equal to one single-process forward of the same held-out samples,
and evaluating changes nothing about training (real gloo ranks, fp32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from dist_cases import GPT_FACTORY, LEARNING_RATE, TINY_GPT, engine_config, make_plan

from orchestrator.worker.data import DataConfig
from orchestrator.worker.evaluate import is_eval_step
from orchestrator.worker.local import run_local
from orchestrator.worker.reference import ReferenceTrainer

SEQ = TINY_GPT["sequence_length"]
EVAL_BATCHES = 2
STEPS = range(3)
# Two replicas with uneven shares: 5 samples through two stages (microbatches 2, 2, 1), 3 through
# one stage.
PLAN = make_plan(
    [(5, [((0, 2), "A100"), ((2, 5), "A100")]), (3, [((0, 5), "A100")])], microbatch_size=2
)


def _data(tmp_path: Path) -> DataConfig:
    path = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, 256, 40 * SEQ + 1).astype(np.uint16).tofile(path)
    return DataConfig(
        sequence_length=SEQ,
        token_file=str(path),
        validation_fraction=0.25,  # 10 held-out windows: 2 x 8 samples wrap around them
        global_batch_size=PLAN.global_batch_size,
        vocab_size=256,
    )


def _reference_eval_losses(data: DataConfig) -> dict[int, float]:
    """Single process: train the steps on the whole batch; after each evaluated step, one forward
    of all the validation samples."""
    ref = ReferenceTrainer(
        GPT_FACTORY, dict(TINY_GPT), data, PLAN.global_batch_size, learning_rate=LEARNING_RATE
    )
    losses = {}
    for step in STEPS:
        ref.train_step(step)
        if is_eval_step(step, 2):
            inputs, targets = ref.dataset.validation_batch(  # type: ignore[attr-defined]
                0, EVAL_BATCHES * PLAN.global_batch_size
            )
            with torch.no_grad():
                out = inputs
                for i in range(ref.model.num_planner_layers):
                    out = ref.layers[i](out)
                losses[step] = float(ref.model.loss(out, targets))
    return losses


@pytest.mark.slow  # two 3-rank runs: ~60 s on a busy 2-core machine
def test_plan_eval_loss_equals_single_process_and_changes_nothing(tmp_path: Path) -> None:
    data = _data(tmp_path)
    evaluated = run_local(
        engine_config(PLAN, data=data, eval_every=2, eval_batches=EVAL_BATCHES), STEPS
    )
    plain = run_local(engine_config(PLAN, data=data), STEPS)

    expected = _reference_eval_losses(data)
    assert sorted(expected) == [1]  # eval_every 2: after the second step only
    for step in STEPS:
        shares = [r.eval_loss for rs in evaluated.results.values() for r in rs if r.step == step]
        given = [s for s in shares if s is not None]
        if step not in expected:
            assert given == []
            continue
        assert len(given) == 2  # one share per replica, from its last stage
        assert abs(sum(given) - expected[step]) <= 1e-5 * expected[step]
    # Evaluation changes nothing: parameters and optimizer state equal a run without it.
    assert sorted(evaluated.layer_states) == sorted(plain.layer_states)
    for layer, state in plain.layer_states.items():
        for name, tensor in state["params"].items():
            assert torch.equal(evaluated.layer_states[layer]["params"][name], tensor), name
    # Training losses equal too.
    for rank, results in plain.results.items():
        assert [r.loss for r in results] == [r.loss for r in evaluated.results[rank]]

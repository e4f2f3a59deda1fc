"""Hugging Face models under any plan equal single-process training (fp32, 1e-5 per layer).

Tiny models from configs, a token file, the full recipe: AdamW with weight decay on matrices,
warm-up then cosine decay, global-norm clipping tight enough to act on every step. GPT-2's tied
head sits on another rank than its embedding (their gradients are summed across stages); Llama
has grouped-query attention and SwiGLU, and replicas cut it at different layers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dist_cases import layer_relative_errors, make_plan
from hf_tiny import SEQ, VOCAB, make_folder

from orchestrator.worker.data import DataConfig
from orchestrator.worker.engine import EngineConfig
from orchestrator.worker.local import run_local
from orchestrator.worker.recipe import OptimizerRecipe
from orchestrator.worker.reference import ReferenceTrainer

NUM_STEPS = 3
RTOL = 1e-5
FACTORY = "orchestrator.models.hf_causal:make_hf_model"
RECIPE = OptimizerRecipe(
    name="adamw",
    learning_rate=3e-3,
    weight_decay=0.1,
    warmup_steps=1,
    decay="cosine",
    decay_steps=NUM_STEPS,
    min_learning_rate=3e-4,
    grad_clip_norm=0.05,
)
# 5 planner layers: 0 embedding, 1..3 blocks, 4 head.
PLANS = {
    "gpt2": make_plan(
        [
            (4, [((0, 2), "A100"), ((2, 5), "A100")]),
            (2, [((0, 1), "A100"), ((1, 4), "A100"), ((4, 5), "A100")]),
        ]
    ),
    "llama": make_plan([(5, [((0, 3), "A100"), ((3, 5), "A100")]), (3, [((0, 5), "A100")])]),
}


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.bin"
    ids = np.random.default_rng(0).integers(0, VOCAB, 40 * SEQ + 1).astype(np.uint16)
    ids.tofile(path)
    return path


@pytest.mark.slow  # ~30 s each on an idle 2-core machine (5 ranks, tiny models)
@pytest.mark.parametrize("kind", [*sorted(PLANS), "gpt2-dropout"])
def test_hf_plan_matches_single_process_with_the_full_recipe(kind: str, tmp_path: Path) -> None:
    # gpt2-dropout keeps GPT-2's configured dropout (0.1), seeded per (step, layer, sample).
    dropout = kind.endswith("-dropout")
    kind = kind.removesuffix("-dropout")
    folder = make_folder(tmp_path, kind, weights=True)
    plan = PLANS[kind]
    data = DataConfig(
        sequence_length=SEQ,
        token_file=str(_token_file(tmp_path)),
        global_batch_size=plan.global_batch_size,
        vocab_size=VOCAB,
    )
    kwargs = {"path": str(folder), "sequence_length": SEQ, "dropout": dropout}
    config = EngineConfig(
        model_factory=FACTORY, model_kwargs=kwargs, plan=plan, rank=0, data=data, recipe=RECIPE
    )
    run = run_local(config, range(NUM_STEPS), {})

    ref = ReferenceTrainer(FACTORY, kwargs, data, plan.global_batch_size, recipe=RECIPE)
    losses = [ref.train_step(step) for step in range(NUM_STEPS)]
    errors = layer_relative_errors(run.layer_states, ref.layer_params())
    assert max(errors.values()) <= RTOL, errors
    for step, loss in enumerate(losses):
        shares = [r[step].loss for r in run.results.values() if r[step].loss is not None]
        assert sum(shares) == pytest.approx(loss, rel=1e-5)
    # Training moved the weights (clipping did not zero the update).
    initial = ReferenceTrainer(FACTORY, kwargs, data, plan.global_batch_size, recipe=RECIPE)
    moved = layer_relative_errors(run.layer_states, initial.layer_params())
    assert min(moved.values()) > 1e-4, moved
    if kind == "gpt2":
        # The tied copies are still one weight on every rank that holds one.
        emb, head = run.layer_states[0]["params"], run.layer_states[4]["params"]
        wte = emb["inner.wte.weight" if dropout else "wte.weight"]
        assert (wte - head["lm_head.weight"]).abs().max() <= 1e-6


@pytest.mark.slow  # two short runs of 3 and 2 ranks
def test_resume_under_another_plan_continues_the_recipe_and_the_samples(tmp_path: Path) -> None:
    """Steps 0-1 on one plan, then steps 2-3 from its layer states (moments, step counts) on a
    plan with other cuts: equal to four uninterrupted single-process steps (the schedule is a
    function of the step, the samples of (seed, step, position))."""
    folder = make_folder(tmp_path, "llama", weights=True)
    first = make_plan([(6, [((0, 2), "A100"), ((2, 5), "A100")]), (2, [((0, 5), "A100")])])
    second = make_plan([(8, [((0, 4), "A100"), ((4, 5), "A100")])])
    recipe = OptimizerRecipe(**{**RECIPE.__dict__, "warmup_steps": 2, "decay_steps": 4})
    data = DataConfig(
        sequence_length=SEQ, token_file=str(_token_file(tmp_path)), global_batch_size=8,
        vocab_size=VOCAB,
    )  # fmt: skip
    kwargs = {"path": str(folder), "sequence_length": SEQ}

    def config(plan: object) -> EngineConfig:
        return EngineConfig(
            model_factory=FACTORY, model_kwargs=kwargs, plan=plan, rank=0, data=data, recipe=recipe
        )

    head = run_local(config(first), range(2), {})
    tail = run_local(config(second), range(2, 4), {}, initial_states=head.layer_states)
    ref = ReferenceTrainer(FACTORY, kwargs, data, 8, recipe=recipe)
    for step in range(4):
        ref.train_step(step)
    errors = layer_relative_errors(tail.layer_states, ref.layer_params())
    assert max(errors.values()) <= RTOL, errors

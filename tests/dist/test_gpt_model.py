"""The example GPT: parameter counts match the planner's, and it learns the shipped corpus."""

from __future__ import annotations

import pytest
import torch
from dist_cases import GPT_FACTORY

from orchestrator.errors import SpecError
from orchestrator.models import tokenizer
from orchestrator.models.gpt import make_gpt
from orchestrator.worker.data import DataConfig, builtin_corpus_bytes, make_dataset
from orchestrator.worker.model_api import build_model, check_layer_count
from orchestrator.worker.reference import ReferenceTrainer


@pytest.mark.parametrize("ffn", [None, 48])
def test_layer_parameters_match_the_planner_count(ffn: int | None) -> None:
    model = make_gpt(
        num_layers=2, hidden_size=32, num_heads=4, sequence_length=16, ffn_hidden_size=ffn
    )
    for i in range(model.num_planner_layers):
        built = sum(p.numel() for p in model.build_layer(i).parameters())
        assert built == model.spec.layer_params(i), i


def test_boundary_shape_is_what_layers_emit() -> None:
    model = make_gpt(num_layers=1, hidden_size=32, num_heads=4, sequence_length=16)
    ids = torch.randint(0, 256, (3, 16))
    hidden = model.build_layer(0)(ids)
    assert tuple(hidden.shape) == model.boundary_shape(3)
    assert tuple(model.build_layer(1)(hidden).shape) == model.boundary_shape(3)
    assert model.build_layer(2)(hidden).shape == (3, 16, 256)


def test_byte_tokenizer_round_trips() -> None:
    text = "In the beginning — ünïcode"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert max(tokenizer.encode(text)) < tokenizer.VOCAB_SIZE


def test_corpus_is_shipped_and_batches_are_deterministic_slices() -> None:
    assert builtin_corpus_bytes().startswith(b"Ge1:1 In the beginning God created")
    data = make_dataset(DataConfig(sequence_length=8), seed=3)
    x, y = data.batch(5, 6, 0, 6)
    x2, y2 = data.batch(5, 6, 2, 3)
    assert torch.equal(x[2:5], x2) and torch.equal(y[2:5], y2)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next bytes
    assert not torch.equal(data.batch(6, 6, 0, 6)[0], x)


def test_loss_falls_on_the_corpus() -> None:
    """A tiny GPT on the shipped corpus: the loss falls well below uniform (ln 256 = 5.55)."""
    torch.set_num_threads(2)
    kwargs = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "sequence_length": 32}
    ref = ReferenceTrainer(
        GPT_FACTORY, kwargs, DataConfig(sequence_length=32), 16, learning_rate=3e-3
    )
    losses = [ref.train_step(step) for step in range(150)]
    last = sum(losses[-10:]) / 10
    assert losses[0] > 5.0  # about uniform at init
    assert last < 3.0, (losses[0], last)


def test_bad_factory_and_layer_count_are_user_errors() -> None:
    with pytest.raises(SpecError, match="not of the form"):
        build_model("orchestrator.models.gpt.make_gpt", {})
    with pytest.raises(SpecError, match=r"cannot import module 'no_such_pkg\.models'"):
        build_model("no_such_pkg.models:make", {})
    with pytest.raises(SpecError, match="has no callable 'nope'"):
        build_model("orchestrator.models.gpt:nope", {})
    with pytest.raises(SpecError, match="rejected its arguments"):
        build_model(GPT_FACTORY, {"num_blocks": 3})
    with pytest.raises(SpecError, match="tie_embeddings"):
        build_model(GPT_FACTORY, {"tie_embeddings": True})
    model = build_model(GPT_FACTORY, {"num_layers": 3})
    with pytest.raises(SpecError, match="plan covers 4 planner layers but model 'gpt-tiny' has 5"):
        check_layer_count(model, 4)


def test_dataset_factory_by_import_path() -> None:
    config = DataConfig(
        sequence_length=4,
        dataset_factory="dist_cases:repeated_text_dataset",
        dataset_kwargs={"text": "xy"},
    )
    inputs, _ = make_dataset(config, seed=0).batch(0, 2, 0, 2)
    assert set(inputs.flatten().tolist()) <= {ord("x"), ord("y")}
    with pytest.raises(SpecError, match=r"data\.dataset_factory: module 'dist_cases' has no"):
        make_dataset(DataConfig(sequence_length=4, dataset_factory="dist_cases:GPT_FACTORY"))

"""The optimizer recipe, token files and Hugging Face model sections of a job (single process)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.errors import SpecError
from orchestrator.runtime.jobs import load_job
from orchestrator.spec.job import JobSpec
from orchestrator.spec.loading import load_model
from orchestrator.worker.data import DataConfig, make_dataset
from orchestrator.worker.data_tokens import TokenFileDataset
from orchestrator.worker.optim import clip_coefficient, make_recipe_optimizer
from orchestrator.worker.recipe import OptimizerRecipe


def test_schedule_warms_up_then_decays_to_the_floor() -> None:
    r = OptimizerRecipe(
        learning_rate=1.0, warmup_steps=4, decay="cosine", decay_steps=14, min_learning_rate=0.1
    )
    assert [r.learning_rate_at(k) for k in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert r.learning_rate_at(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert r.learning_rate_at(14) == pytest.approx(0.1)
    assert r.learning_rate_at(100) == pytest.approx(0.1)
    linear = OptimizerRecipe(learning_rate=1.0, decay="linear", decay_steps=10)
    assert linear.learning_rate_at(5) == pytest.approx(0.5)
    assert OptimizerRecipe(learning_rate=2.0).learning_rate_at(1000) == 2.0


def test_weight_decay_skips_norms_and_biases() -> None:
    layer = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = make_recipe_optimizer(
        OptimizerRecipe(name="adamw", weight_decay=0.1), layer.named_parameters()
    )
    assert isinstance(opt, torch.optim.AdamW)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(layer[0].weight)}


def test_clip_coefficient_is_torchs() -> None:
    params = [torch.nn.Parameter(torch.ones(3)) for _ in range(2)]
    for p in params:
        p.grad = torch.full((3,), 2.0)
    squared = sum(float(p.grad.pow(2).sum()) for p in params)
    ours = clip_coefficient(squared, 1.0)
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    assert float(params[0].grad[0]) == pytest.approx(2.0 * ours, rel=1e-6)
    assert ours == pytest.approx(1.0 / (float(norm) + 1e-6))
    assert clip_coefficient(0.25, 1.0) == 1.0


def _tokens(tmp_path: Path, n: int, high: int = 50, dtype: type = np.uint16) -> Path:
    path = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, high, n).astype(dtype).tofile(path)
    return path


def test_sampling_is_a_pure_function_of_seed_step_and_position(tmp_path: Path) -> None:
    path = _tokens(tmp_path, 8 * 20 + 1)
    a = TokenFileDataset(path, "uint16", 8, seed=3, validation_fraction=0.25)
    b = TokenFileDataset(path, "uint16", 8, seed=3, validation_fraction=0.25)
    assert a.num_train_windows == 15 and a.num_validation_windows == 5
    whole_x, whole_y = a.batch(7, 6, 0, 6)
    part_x, _ = b.batch(7, 6, 2, 3)  # another rank's slice, another process
    assert torch.equal(whole_x[2:5], part_x)
    assert torch.equal(whole_x[:, 1:], whole_y[:, :-1])  # targets are the next tokens
    # One epoch (15 samples = steps 0..4 of 3) visits every training window exactly once.
    seen = [w for k in range(5) for w in a.window_indices(k, 3, 0, 3)]
    assert sorted(seen) == list(range(15))
    assert seen != [w for k in range(5, 10) for w in a.window_indices(k, 3, 0, 3)]  # reshuffled
    # Validation windows are never trained on.
    vx, _ = a.validation_batch(0, 5)
    raw = np.fromfile(path, dtype=np.uint16)
    assert torch.equal(vx[0], torch.from_numpy(raw[15 * 8 : 16 * 8].astype(np.int64)))


def test_token_file_errors_are_one_line_before_training(tmp_path: Path) -> None:
    path = _tokens(tmp_path, 8 * 3 + 1)
    short = DataConfig(sequence_length=8, token_file=str(path), global_batch_size=4, vocab_size=64)
    with pytest.raises(SpecError, match="fewer than one global batch"):
        make_dataset(short)
    wide = _tokens(tmp_path, 8 * 10 + 1, high=1000)
    with pytest.raises(SpecError, match="outside the model's vocab_size 64"):
        make_dataset(DataConfig(8, token_file=str(wide), global_batch_size=4, vocab_size=64))
    wide.with_name("train.bin.json").write_text(json.dumps({"vocab_size": 50257}))
    with pytest.raises(SpecError, match="tokenizer of 50257 ids"):
        make_dataset(DataConfig(8, token_file=str(wide), global_batch_size=4, vocab_size=64))
    with pytest.raises(SpecError, match=r"data\.tokens"):
        make_dataset(DataConfig(8, token_file=str(tmp_path / "missing.bin"), global_batch_size=1))


def _llama_folder(root: Path, **overrides: object) -> Path:
    folder = root / "tiny-llama"
    folder.mkdir()
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 172,
        "vocab_size": 300,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        **overrides,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_job_names_a_hugging_face_folder(tmp_path: Path) -> None:
    folder = _llama_folder(tmp_path)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        "name: ft\nmodel: {huggingface: tiny-llama, sequence_length: 32}\n"
        "data: {tokens: train.bin}\ntraining: {optimizer: adamw, grad_clip_norm: 1.0}\n"
    )
    job = load_job(job_file)
    shape = job.model.shape
    assert (shape.num_layers, shape.num_kv_heads, shape.sequence_length) == (2, 2, 32)
    assert shape.gated_mlp and not shape.bias and job.model.factory.endswith(":make_hf_model")
    assert job.model.kwargs["path"] == str(folder)
    # GQA and SwiGLU are counted exactly: q,o 64x64; k,v 64x16; gate/up/down 64x172; 2 RMSNorms
    assert shape.layer_params(1) == 2 * 64 * 64 + 2 * 64 * 16 + 3 * 64 * 172 + 2 * 64
    assert load_model(folder) == shape.model_copy(update={"sequence_length": 128})


def test_bad_hugging_face_sections_are_one_line(tmp_path: Path) -> None:
    _llama_folder(tmp_path, model_type="t5")
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: ft\nmodel: {huggingface: tiny-llama}\ndata: {}\n")
    with pytest.raises(SpecError, match="model_type 't5' is not supported"):
        load_job(job_file)
    job_file.write_text("name: ft\nmodel: {huggingface: tiny-llama, factory: a.b:c}\ndata: {}\n")
    with pytest.raises(SpecError, match="not both"):
        load_job(job_file)
    job_file.write_text("name: ft\nmodel: {huggingface: nowhere}\ndata: {}\n")
    with pytest.raises(SpecError, match=r"model\.huggingface"):
        load_job(job_file)


def test_published_llama_configs_count_their_published_parameters(tmp_path: Path) -> None:
    """Llama-7B's block is Cephalo's 202,383,360 parameters; Llama-3-8B (grouped-query, 8 kv
    heads) totals its published 8,030,261,248."""
    from orchestrator.spec.hf_config import model_spec_from_hf_config

    llama7b = {
        "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
        "max_position_embeddings": 2048,
    }  # fmt: skip
    assert model_spec_from_hf_config(llama7b, "llama-7b").layer_params(1) == 202_383_360
    llama3 = {
        **llama7b, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
    }  # fmt: skip
    spec = model_spec_from_hf_config(llama3, "llama-3-8b", sequence_length=4096)
    assert spec.total_params == 8_030_261_248
    assert spec.dtype.value == "bf16" and spec.sequence_length == 4096


def test_a_resolved_job_reads_back_unchanged(tmp_path: Path) -> None:
    _llama_folder(tmp_path)
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: ft\nmodel: {huggingface: tiny-llama}\ndata: {}\n")
    job = load_job(job_file)
    again = JobSpec.model_validate_json(job.model_dump_json())  # as it travels to the workers
    assert again == job

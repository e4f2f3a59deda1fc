"""``orchestrator data prepare`` and ``orchestrator export`` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchestrator.cli.main import main


def test_prepare_bytes_of_the_shipped_corpus(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "train.bin"
    assert main(["data", "prepare", "--out", str(out), "--no-progress"]) == 0
    from orchestrator.worker.data import builtin_corpus_bytes

    corpus = builtin_corpus_bytes()
    ids = np.fromfile(out, dtype=np.uint16)
    assert ids.tolist()[:1000] == list(corpus[:1000]) and len(ids) == len(corpus)
    meta = json.loads((tmp_path / "train.bin.json").read_text())
    assert meta["vocab_size"] == 256 and meta["num_tokens"] == len(corpus)
    assert "tokens" in capsys.readouterr().out


def test_prepare_with_a_local_tokenizer_shows_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["in", "the", "beginning", "god", "created", "[UNK]"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    text = tmp_path / "corpus.txt"
    text.write_text("in the beginning god created\nthe heaven\n" * 50)
    out = tmp_path / "t.bin"
    code = main(
        [
            "data",
            "prepare",
            "--input",
            str(text),
            "--out",
            str(out),
            "--tokenizer",
            str(tmp_path / "tok"),
        ]
    )
    assert code == 0
    ids = np.fromfile(out, dtype=np.uint16)
    assert ids[:7].tolist() == [0, 1, 2, 3, 4, 1, 5]  # "heaven" is unknown
    assert "tokenizing" in capsys.readouterr().err  # the progress bar


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--input", "nowhere.txt"], "--input: corpus nowhere.txt is not a file"),
        (["--tokenizer", "no-tok"], "--tokenizer: tokenizer folder no-tok does not exist"),
    ],
)
def test_prepare_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str
) -> None:
    out = tmp_path / "x.bin"
    assert main(["data", "prepare", "--out", str(out), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_export_a_checkpoint_loads_with_from_pretrained(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from orchestrator.models.hf_causal import HFCausalLM
    from orchestrator.worker.checkpoint import save_checkpoint
    from orchestrator.worker.layers import build_layers

    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        vocab_size=64,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    config.save_pretrained(tmp_path / "model")
    model = HFCausalLM(tmp_path / "model", 16)
    layers = build_layers(model, range(4), 7, torch.device("cpu"))
    states = {i: {"params": m.state_dict(), "optimizer": {}} for i, m in layers.items()}
    save_checkpoint(tmp_path / "ckpt", 5, states)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: ft\nmodel: {huggingface: model, sequence_length: 16}\ndata: {}\n"
        "checkpoint: {dir: ckpt}\n"
    )
    assert main(["export", str(job), "--out", str(tmp_path / "out")]) == 0
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        out = ids
        for i in range(4):
            out = layers[i](out)
        assert torch.allclose(loaded(input_ids=ids).logits, out, atol=1e-5)
    assert main(["export", str(job), "--out", str(tmp_path / "out")]) == 2  # exists already


def test_prepare_from_a_saved_hf_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from datasets import Dataset, DatasetDict

    texts = Dataset.from_dict({"text": ["in the", "beginning"], "n": [1, 2]})
    ids = Dataset.from_dict({"input_ids": [[5, 6, 7], [8, 300]]})
    DatasetDict({"train": texts}).save_to_disk(str(tmp_path / "texts"))
    ids.save_to_disk(str(tmp_path / "ids"))

    out = tmp_path / "a.bin"
    argv = ["data", "prepare", "--hf-dataset", str(tmp_path / "texts"), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    assert np.fromfile(out, dtype=np.uint16).tolist() == list(b"in the" + b"beginning")
    out_ids = tmp_path / "b.bin"
    argv = ["data", "prepare", "--hf-dataset", str(tmp_path / "ids"), "--column", "input_ids"]
    assert main([*argv, "--out", str(out_ids), "--no-progress"]) == 0
    assert np.fromfile(out_ids, dtype=np.uint16).tolist() == [5, 6, 7, 8, 300]
    assert json.loads((tmp_path / "b.bin.json").read_text())["vocab_size"] == 301

    capsys.readouterr()
    bad = ["data", "prepare", "--hf-dataset", str(tmp_path / "texts"), "--column", "body"]
    assert main([*bad, "--out", str(tmp_path / "c.bin"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no column 'body' (it has text, n)" in err[0]
    assert not (tmp_path / "c.bin").exists()

"""``data: {hf_dataset: DIR, column, tokenizer}``: a saved Hugging Face dataset tokenized once into
a cached token file, sampled as a pure function of (seed, step, position), and every mistake one
line with exit code 2 before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_data_fixtures import DOCUMENTS, make_dataset, make_tokenizer

from orchestrator.cli.main import main
from orchestrator.errors import SpecError
from orchestrator.runtime.jobs import load_job, worker_job
from orchestrator.worker import data_hf
from orchestrator.worker.data import DataConfig
from orchestrator.worker.data import make_dataset as open_data


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    make_tokenizer(root / "tok")
    make_dataset(root / "ds", repeat=20)
    return root


def _config(root: Path, **overrides: object) -> DataConfig:
    fields: dict[str, object] = {
        "sequence_length": 8,
        "hf_dataset": str(root / "ds"),
        "hf_tokenizer": str(root / "tok"),
        "global_batch_size": 4,
        "vocab_size": 64,
        **overrides,
    }
    return DataConfig(**fields)  # type: ignore[arg-type]


def test_text_is_tokenized_once_with_eos_between_documents(
    files: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv(data_hf.CACHE_ENV, str(tmp_path / "cache"))
    first = open_data(_config(files))
    tok = AutoTokenizer.from_pretrained(str(files / "tok"))
    expected: list[int] = []
    for doc in DOCUMENTS * 20:
        expected += [*tok(doc, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    assert np.asarray(first.tokens).tolist() == expected
    assert first.path.parent == tmp_path / "cache"
    meta = json.loads(first.path.with_name(first.path.name + ".json").read_text())
    assert (meta["vocab_size"], meta["num_tokens"], meta["dtype"]) == (
        len(tok),
        len(expected),
        "uint16",
    )

    # A second process finds the cache: nothing is tokenized again.
    def no_tokenizing(self: object) -> None:
        raise AssertionError("tokenized twice")

    monkeypatch.setattr(data_hf.HFTokens, "_rows", no_tokenizing)
    monkeypatch.setattr(data_hf, "load_tokenizer", no_tokenizing)  # nor loads the tokenizer
    again = open_data(_config(files))
    assert again.path == first.path and np.array_equal(again.tokens, first.tokens)


def test_cache_key_follows_column_and_tokenizer(
    files: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(data_hf.CACHE_ENV, str(tmp_path / "cache"))
    text = open_data(_config(files))
    ids = open_data(_config(files, hf_column="input_ids", hf_tokenizer=None))
    make_tokenizer(tmp_path / "tok2", extra_words=3)
    other = open_data(_config(files, hf_tokenizer=str(tmp_path / "tok2")))
    assert len({text.path, ids.path, other.path}) == 3
    # A token-id column is written as it is, rows in order, no separator added.
    from datasets import load_from_disk

    rows = load_from_disk(str(files / "ds"))["input_ids"]
    assert np.asarray(ids.tokens).tolist() == [t for row in rows for t in row]


def test_sampling_is_pure_and_epochs_cover_the_dataset(
    files: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(data_hf.CACHE_ENV, str(tmp_path / "cache"))
    a = open_data(_config(files, validation_fraction=0.2), seed=5)
    b = open_data(_config(files, validation_fraction=0.2), seed=5)  # another worker
    whole_x, whole_y = a.batch(3, 6, 0, 6)
    part_x, part_y = b.batch(3, 6, 4, 2)  # that worker's slice only
    assert torch.equal(whole_x[4:], part_x) and torch.equal(whole_y[4:], part_y)
    assert torch.equal(whole_x[:, 1:], whole_y[:, :-1])
    n = a.num_train_windows
    seen = [w for k in range(n) for w in a.window_indices(k, 1, 0, 1)]
    assert sorted(seen) == list(range(n))  # one epoch visits every training window once
    assert all(w < n for k in range(2 * n) for w in a.window_indices(k, 1, 0, 1))
    vx, _ = a.validation_batch(0, 1)  # held out: after every training window
    assert torch.equal(vx[0], torch.from_numpy(np.asarray(a.tokens[n * 8 : n * 8 + 8], np.int64)))
    other_seed = open_data(_config(files), seed=6)
    assert not torch.equal(
        other_seed.batch(3, 6, 0, 6)[0], open_data(_config(files), 5).batch(3, 6, 0, 6)[0]
    )


def test_cache_beside_the_dataset_when_writable(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(data_hf.CACHE_ENV, raising=False)
    dataset = open_data(_config(files))
    assert dataset.path.parent == files / "ds" / data_hf.CACHE_DIR_NAME
    from datasets import load_from_disk

    assert len(load_from_disk(str(files / "ds"))) == 100  # the folder still loads


def _job(root: Path, data: str, vocab: int = 64, batch: int = 4) -> Path:
    job = root / "job.yaml"
    job.write_text(
        "name: hfdata\n"
        "model:\n  factory: orchestrator.models.gpt:make_gpt\n"
        f"  shape: {{name: t, num_layers: 2, hidden_size: 16, num_heads: 2, "
        f"sequence_length: 8, vocab_size: {vocab}, dtype: fp32}}\n"
        f"data: {data}\n"
        f"training: {{global_batch_size: {batch}, microbatch_sizes: [{batch}], "
        "mixed_precision: false, steps: 2}\n"
        "metrics: {port: null}\n"
    )
    return job


def test_job_form_resolves_folders_beside_the_job(files: Path) -> None:
    job_file = _job(files, "{hf_dataset: ds, tokenizer: tok, validation_fraction: 0.1}")
    data = worker_job(load_job(job_file), job_file).data
    assert data["hf_dataset"] == str(files / "ds") and data["hf_tokenizer"] == str(files / "tok")
    assert (data["hf_column"], data["hf_split"]) == ("text", "train")
    with pytest.raises(SpecError, match="column only go with hf_dataset"):
        load_job(_job(files, "{tokens: x.bin, column: text}"))
    with pytest.raises(SpecError, match="not tokens and hf_dataset"):
        load_job(_job(files, "{tokens: x.bin, hf_dataset: ds}"))


@pytest.mark.parametrize(
    ("data", "vocab", "batch", "message"),
    [
        ("{hf_dataset: nowhere, tokenizer: tok}", 64, 4, "data.hf_dataset: dataset folder"),
        ("{hf_dataset: tok, tokenizer: tok}", 64, 4, "is not a saved dataset"),
        (
            "{hf_dataset: ds, column: body, tokenizer: tok}",
            64,
            4,
            "data.column: dataset {root}/ds has no column 'body' (it has text, input_ids)",
        ),
        ("{hf_dataset: ds, tokenizer: no-tok}", 64, 4, "data.tokenizer: tokenizer folder"),
        ("{hf_dataset: ds}", 64, 4, "holds text, and no tokenizer is named"),
        (
            "{hf_dataset: ds, tokenizer: tok}",
            16,
            4,
            "has 27 ids, more than the model's vocab_size 16",
        ),
        ("{hf_dataset: ds, tokenizer: tok}", 64, 512, "fewer than one global batch of 512"),
        ("{hf_dataset: ds, split: test, tokenizer: tok}", 64, 4, "data.split"),
    ],
)
def test_bad_data_is_one_line_before_anything_starts(
    files: Path,
    capsys: pytest.CaptureFixture[str],
    data: str,
    vocab: int,
    batch: int,
    message: str,
) -> None:
    if "split" in data:  # a DatasetDict with a train split only
        from datasets import DatasetDict, load_from_disk

        if not (files / "dd").exists():
            DatasetDict({"train": load_from_disk(str(files / "ds"))}).save_to_disk(
                str(files / "dd")
            )
        data = data.replace("ds", "dd")
    job = _job(files, data, vocab, batch)
    capsys.readouterr()
    # A live-looking address nobody serves: reaching the address check would fail differently.
    code = main(["run", str(job), "--address", "127.0.0.1:1", "--metrics-port", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert message.format(root=files) in err[0]
    assert "Traceback" not in err[0] and "127.0.0.1:1" not in err[0]

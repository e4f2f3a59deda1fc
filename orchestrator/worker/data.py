"""Deterministic training data: the global batch of step ``k`` is a function of (seed, k).

Every rank draws the same global batch and takes its replica's slice
(``replica_sample_offset``, ``replica_batch_size``), so a plan with any batch shares trains on
exactly the samples single-process training sees. Only the first stage needs inputs and only
the last needs targets; both read them locally, so nothing but activations crosses the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from orchestrator.errors import SpecError
from orchestrator.worker.model_api import load_factory

BUILTIN_CORPUS = "kjv-genesis.txt"


@dataclass(frozen=True)
class DataConfig:
    """Where samples come from.

    ``dataset_factory`` (``"module:function"``, called with ``sequence_length`` and ``seed`` and
    ``dataset_kwargs``) takes precedence; otherwise a byte-level corpus file (``corpus_path``, or
    the corpus shipped in the package when None) is cut into windows of ``sequence_length + 1``.
    """

    sequence_length: int
    corpus_path: str | None = None
    dataset_factory: str | None = None
    dataset_kwargs: tuple[tuple[str, Any], ...] = ()
    # A token file (orchestrator.worker.data_tokens) and its id width.
    token_file: str | None = None
    token_dtype: str = "uint16"
    validation_fraction: float = 0.0
    # A Hugging Face dataset saved to disk (orchestrator.worker.data_hf): folder, column,
    # local tokenizer folder, split of a DatasetDict.
    hf_dataset: str | None = None
    hf_column: str = "text"
    hf_tokenizer: str | None = None
    hf_split: str = "train"
    # For the checks before anything starts (file long enough, ids within the vocabulary).
    global_batch_size: int | None = None
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        # Accept a mapping (as written in a job file); store sorted pairs so the config hashes.
        kwargs: Any = self.dataset_kwargs
        if isinstance(kwargs, dict):
            object.__setattr__(self, "dataset_kwargs", tuple(sorted(kwargs.items())))


@runtime_checkable
class Dataset(Protocol):
    """Yields the slice ``[start, start + count)`` of step ``step``'s global batch."""

    def batch(
        self, step: int, global_batch_size: int, start: int, count: int
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def builtin_corpus_bytes() -> bytes:
    """The public-domain corpus shipped with the package (see orchestrator/data/corpus/)."""
    corpus_dir = Path(__file__).resolve().parent.parent / "data" / "corpus"
    return (corpus_dir / BUILTIN_CORPUS).read_bytes()


class CorpusDataset:
    """Random windows of a byte corpus: input bytes and the next bytes as targets."""

    def __init__(self, data: bytes, sequence_length: int, seed: int = 0) -> None:
        if len(data) < sequence_length + 2:
            raise SpecError(
                f"corpus has {len(data)} bytes, fewer than sequence_length + 2 "
                f"({sequence_length + 2})",
                field="data.corpus",
                fix="use a longer corpus or a shorter sequence_length",
            )
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.sequence_length = sequence_length
        self.seed = seed

    def offsets(self, step: int, global_batch_size: int) -> torch.Tensor:
        """Start offsets of the whole global batch of ``step`` (same on every rank)."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        high = len(self.tokens) - self.sequence_length - 1
        return torch.randint(0, high, (global_batch_size,), generator=generator)

    def batch(
        self, step: int, global_batch_size: int, start: int, count: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.offsets(step, global_batch_size)[start : start + count]
        window = torch.arange(self.sequence_length + 1)
        rows = self.tokens[starts[:, None] + window[None, :]]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def make_dataset(config: DataConfig, seed: int = 0) -> Dataset:
    """Build the dataset a :class:`DataConfig` names (a token file is checked here too)."""
    if config.hf_dataset is not None:
        from orchestrator.worker.data_hf import HFDataSource, open_hf_dataset

        source = HFDataSource(
            config.hf_dataset, config.hf_column, config.hf_tokenizer, config.hf_split
        )
        return open_hf_dataset(
            source,
            config.sequence_length,
            seed,
            config.validation_fraction,
            config.global_batch_size,
            config.vocab_size,
        )
    if config.token_file is not None:
        from orchestrator.worker.data_tokens import TokenFileDataset

        tokens = TokenFileDataset(
            config.token_file,
            config.token_dtype,
            config.sequence_length,
            seed,
            config.validation_fraction,
        )
        if config.global_batch_size is not None:
            tokens.check(config.global_batch_size, config.vocab_size)
        return tokens
    if config.dataset_factory:
        factory = load_factory(config.dataset_factory, field="data.dataset_factory")
        dataset = factory(
            sequence_length=config.sequence_length, seed=seed, **dict(config.dataset_kwargs)
        )
        if not isinstance(dataset, Dataset):
            raise SpecError(
                f"dataset factory {config.dataset_factory!r} returned {type(dataset).__name__} "
                "without a batch(step, global_batch_size, start, count) method",
                field="data.dataset_factory",
                fix="return an object with that method",
            )
        return dataset
    if config.corpus_path is None:
        return CorpusDataset(builtin_corpus_bytes(), config.sequence_length, seed)
    path = Path(config.corpus_path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(
            f"cannot read corpus {path}: {exc.strerror}",
            field="data.corpus_path",
            fix="point to a readable text file, or leave it empty for the built-in corpus",
        ) from None
    return CorpusDataset(data, config.sequence_length, seed)


def check_data(config: DataConfig, seed: int = 0) -> None:
    """Open the data as a worker would and run its checks (before anything starts)."""
    make_dataset(config, seed)

"""A Hugging Face ``datasets`` dataset saved to disk as training data.

``data: {hf_dataset: DIR, column: text, tokenizer: TOK}`` names a folder written by
``Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``, with ``split``), a column of text or
of token ids (lists of integers), and, for text, a local tokenizer folder read by
``transformers.AutoTokenizer``.

The dataset is tokenized once, deterministically, into a token file (the form
:mod:`orchestrator.worker.data_tokens` samples from): rows in dataset order, each text row's ids
(without the tokenizer's own special tokens) followed by its end-of-sequence id, a token-id row's
ids as they are. The file is a cache keyed by the dataset's fingerprint, the split, the column,
and a digest of the tokenizer's files; it is written into a temporary file and renamed into
place, so whoever tokenizes first (the driver, when the job is checked) leaves it for every
worker, and two processes tokenizing at once write the same bytes. A worker then memory-maps it
and reads only its own samples, with the token file's sampling: a pure function of
(seed, step, position), epochs over the dataset, the last ``validation_fraction`` held out.

The cache lies in ``$ORCHESTRATOR_DATA_CACHE`` when set, else in ``DIR/.orchestrator-tokens/``
when the dataset folder is writable, else in ``~/.cache/orchestrator/tokens/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.errors import SpecError
from orchestrator.worker.data_tokens import META_SUFFIX, TokenFileDataset

CACHE_ENV = "ORCHESTRATOR_DATA_CACHE"
CACHE_FORMAT = "orchestrator-hf-tokens/v1"
CACHE_DIR_NAME = ".orchestrator-tokens"
ROWS_PER_BATCH = 1000  # rows handed to the tokenizer at a time (its batched Rust path)
MAX_TOKENIZER_FILE_BYTES = 256 << 20  # files hashed into the cache key (larger ones: name + size)


@dataclass(frozen=True)
class HFDataSource:
    """The job's ``hf_dataset`` form, paths resolved."""

    folder: str
    column: str = "text"
    tokenizer: str | None = None
    split: str = "train"


def open_saved_dataset(
    folder: str,
    split: str,
    folder_field: str = "data.hf_dataset",
    split_field: str = "data.split",
) -> Any:
    """The ``datasets.Dataset`` saved in ``folder`` (the split ``split`` of a DatasetDict).

    ``folder_field`` / ``split_field`` name the setting in errors (the job's fields, or a
    command's flags)."""
    path = Path(folder)
    if not path.is_dir():
        raise SpecError(
            f"dataset folder {path} does not exist",
            field=folder_field,
            fix="point to a folder written by Dataset.save_to_disk",
        )
    from datasets import DatasetDict, load_from_disk

    try:
        data = load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SpecError(
            f"{path} is not a saved dataset: {first}",
            field=folder_field,
            fix="point to a folder written by Dataset.save_to_disk",
        ) from None
    if isinstance(data, DatasetDict):
        if split not in data:
            raise SpecError(
                f"dataset {path} has no split {split!r} (it has {', '.join(sorted(data))})",
                field=split_field,
                fix="name one of its splits",
            )
        data = data[split]
    return data


def column_kind(data: Any, column: str, folder: str) -> str:
    """``"text"`` or ``"ids"``: what ``column`` holds; a one-line error when neither or absent."""
    if column not in data.column_names:
        raise SpecError(
            f"dataset {folder} has no column {column!r} (it has {', '.join(data.column_names)})",
            field="data.column",
            fix="name the column that holds the text or the token ids",
        )
    feature = data.features[column]
    dtype = getattr(feature, "dtype", None)
    if dtype in ("string", "large_string"):
        return "text"
    inner = getattr(feature, "feature", None)  # List / Sequence / LargeList of a Value
    if getattr(inner, "dtype", "").startswith(("int", "uint")):
        return "ids"
    raise SpecError(
        f"column {column!r} of dataset {folder} holds {feature}, neither text nor lists of "
        "token ids",
        field="data.column",
        fix="name a text column or a column of integer lists",
    )


def load_tokenizer(folder: str) -> Any:
    """``transformers.AutoTokenizer`` of a local folder (never downloads)."""
    path = Path(folder)
    if not path.is_dir():
        raise SpecError(
            f"tokenizer folder {path} does not exist",
            field="data.tokenizer",
            fix="point to a folder saved by tokenizer.save_pretrained (tokenizer.json ...)",
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SpecError(
            f"no tokenizer in {path}: {first}",
            field="data.tokenizer",
            fix="point to a folder saved by tokenizer.save_pretrained (tokenizer.json ...)",
        ) from None


def tokenizer_digest(folder: str) -> str:
    """A digest of the tokenizer folder's files (names and bytes), for the cache key."""
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(folder)).encode() + b"\0")
        size = file.stat().st_size
        if size <= MAX_TOKENIZER_FILE_BYTES:
            digest.update(file.read_bytes())
        else:
            digest.update(str(size).encode())
    return digest.hexdigest()


def cache_folder(dataset_folder: str) -> Path:
    """Where the tokenized file is kept (see the module docstring)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    beside = Path(dataset_folder) / CACHE_DIR_NAME
    if os.access(dataset_folder, os.W_OK) or (beside.is_dir() and os.access(beside, os.W_OK)):
        return beside
    return Path.home() / ".cache" / "orchestrator" / "tokens"


def _atomic_write(path: Path, write: Any) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; workers may run as another user
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class HFTokens:
    """A saved dataset, its column and tokenizer, and the token file they tokenize into."""

    def __init__(self, source: HFDataSource) -> None:
        self.source = source
        self.data = open_saved_dataset(source.folder, source.split)
        self.kind = column_kind(self.data, source.column, source.folder)
        if self.kind == "text" and source.tokenizer is None:
            raise SpecError(
                f"column {source.column!r} of dataset {source.folder} holds text, and no "
                "tokenizer is named",
                field="data.tokenizer",
                fix="name a local tokenizer folder (the model's own)",
            )
        if source.tokenizer is not None and not Path(source.tokenizer).is_dir():
            load_tokenizer(source.tokenizer)  # its one-line error
        # The tokenizer's files decide its ids and EOS, so their digest keys the cache, and a
        # process that finds the cache never loads the tokenizer (nor imports transformers).
        self._tokenizer: Any = None
        key = {
            "format": CACHE_FORMAT,
            "fingerprint": self.data._fingerprint,
            "rows": len(self.data),
            "split": source.split,
            "column": source.column,
            "tokenizer": tokenizer_digest(source.tokenizer) if source.tokenizer else None,
        }
        self.key = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        self.path = cache_folder(source.folder) / f"{Path(source.folder).name}-{self.key}.bin"

    @property
    def tokenizer(self) -> Any:
        """The named tokenizer, loaded on first use; None without one."""
        if self._tokenizer is None and self.source.tokenizer is not None:
            self._tokenizer = load_tokenizer(self.source.tokenizer)
        return self._tokenizer

    @property
    def vocab_size(self) -> int | None:
        """The tokenizer's vocabulary with its added tokens (``len()``, not ``.vocab_size``), as
        the cache recorded it or from the tokenizer; None without a tokenizer."""
        if self.source.tokenizer is None:
            return None
        if self.cached():
            return int(self._meta()["vocab_size"])
        return len(self.tokenizer)

    @property
    def eos_id(self) -> int | None:
        """The id written after each text row (None for token ids, or a tokenizer without EOS)."""
        if self.kind != "text":
            return None
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return int(eos) if eos is not None else None

    def check_vocab(self, model_vocab_size: int | None) -> None:
        """The tokenizer's vocabulary must fit the model's embedding (before any tokenizing)."""
        if model_vocab_size is None or self.vocab_size is None:
            return
        if self.vocab_size > model_vocab_size:
            raise SpecError(
                f"tokenizer {self.source.tokenizer} has {self.vocab_size} ids, more than the "
                f"model's vocab_size {model_vocab_size}",
                field="data.tokenizer",
                fix="use the model's own tokenizer, or a model with a larger vocabulary",
            )

    def _meta_path(self) -> Path:
        return self.path.with_name(self.path.name + META_SUFFIX)

    def _meta(self) -> dict[str, Any]:
        data = json.loads(self._meta_path().read_text())
        return data if isinstance(data, dict) else {}

    def cached(self) -> bool:
        """The token file was written completely (its description is written last)."""
        if not (self._meta_path().is_file() and self.path.is_file()):
            return False
        try:
            return bool(self._meta().get("key") == self.key)
        except (OSError, json.JSONDecodeError):
            return False

    def _rows(self) -> Any:
        """Each row's ids, in dataset order (text tokenized in batches, then its EOS id)."""
        column = self.source.column
        eos = self.eos_id
        for first in range(0, len(self.data), ROWS_PER_BATCH):
            rows = self.data[first : first + ROWS_PER_BATCH][column]
            if self.kind == "ids":
                yield from rows
                continue
            encoded = self.tokenizer(rows, add_special_tokens=False)["input_ids"]
            for ids in encoded:
                yield [*ids, eos] if eos is not None else ids

    def ensure(self) -> Path:
        """Tokenize into the cache unless it is there already; the token file's path."""
        if self.cached():
            return self.path
        vocab = self.vocab_size
        eos_id = self.eos_id
        if vocab is None:  # token ids without a tokenizer: the ids' own range
            high = -1
            for ids in self._rows():
                if ids:
                    high = max(high, max(ids))
            vocab = high + 1
        dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
        total = 0
        low = 0

        def write(f: Any) -> None:
            nonlocal total, low
            for ids in self._rows():
                if ids:
                    low = min(low, min(ids))
                    np.asarray(ids, dtype=np.int64).astype(dtype).tofile(f)
                    total += len(ids)

        _atomic_write(self.path, write)
        if low < 0:
            self.path.unlink(missing_ok=True)
            raise SpecError(
                f"column {self.source.column!r} of dataset {self.source.folder} holds a negative "
                "token id",
                field="data.column",
                fix="token ids are 0 .. vocab_size - 1",
            )
        meta = {
            "format": CACHE_FORMAT,
            "key": self.key,
            "dtype": np.dtype(dtype).name,
            "vocab_size": vocab,
            "num_tokens": total,
            "tokenizer": self.source.tokenizer,
            "eos_id": eos_id,
            "source": f"{self.source.folder}:{self.source.split}:{self.source.column}",
        }
        text = (json.dumps(meta, indent=2) + "\n").encode()
        _atomic_write(self._meta_path(), lambda f: f.write(text))
        return self.path

    def dtype(self) -> str:
        """The cached token file's id width."""
        return str(self._meta()["dtype"])


def open_hf_dataset(
    source: HFDataSource,
    sequence_length: int,
    seed: int = 0,
    validation_fraction: float = 0.0,
    global_batch_size: int | None = None,
    vocab_size: int | None = None,
) -> TokenFileDataset:
    """The dataset's token file (tokenized here if no process did yet), checked when a global
    batch size is given: the tokenizer's vocabulary against the model's, the length against one
    global batch."""
    tokens = HFTokens(source)
    if global_batch_size is not None:
        tokens.check_vocab(vocab_size)
    path = tokens.ensure()
    dataset = TokenFileDataset(path, tokens.dtype(), sequence_length, seed, validation_fraction)
    if global_batch_size is not None:
        dataset.check(
            global_batch_size,
            vocab_size,
            label=f"dataset {source.folder} (column {source.column!r})",
            field="data.hf_dataset",
        )
    return dataset

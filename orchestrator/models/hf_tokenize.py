"""Tokenize a text corpus or a saved Hugging Face dataset into a token file
(``orchestrator data prepare``).

A dataset saved with ``datasets``' ``save_to_disk`` is read with ``load_from_disk``; its column
holds text (tokenized here) or token ids (lists of integers, written as they are). Rows are
concatenated in order.

The tokenizer is a local Hugging Face folder (``tokenizer.json``, or ``vocab.json`` +
``merges.txt`` and the like through ``transformers.AutoTokenizer``), or bytes (vocabulary 256)
without one. Ids are written as uint16 when the vocabulary fits, else uint32, into a temporary
file renamed into place, with ``FILE.json`` beside it (dtype, vocabulary size, token count,
tokenizer) that the job's data checks read.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.errors import SpecError

TOKENS_FORMAT = "orchestrator-tokens/v1"
CHUNK_BYTES = 1 << 20  # tokenize about 1 MiB of text at a time, cut at line ends


@dataclass(frozen=True)
class Prepared:
    """What was written."""

    path: Path
    num_tokens: int
    vocab_size: int
    dtype: str


def load_tokenizer(folder: Path | str | None) -> tuple[Callable[[str], list[int]], int, str]:
    """(encode, vocabulary size, description) of a local tokenizer folder, or of bytes."""
    if folder is None:
        return (lambda text: list(text.encode("utf-8"))), 256, "bytes"
    p = Path(folder)
    if not p.is_dir():
        raise SpecError(
            f"tokenizer folder {p} does not exist",
            field="--tokenizer",
            fix="point to a folder with tokenizer.json (or vocab.json and merges.txt)",
        )
    if (p / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(p / "tokenizer.json"))
        return (lambda text: tok.encode(text).ids), tok.get_vocab_size(), str(p)
    try:
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(str(p))
    except (OSError, ValueError) as exc:
        raise SpecError(
            f"no tokenizer in {p}: {str(exc).splitlines()[0]}",
            field="--tokenizer",
            fix="point to a folder with tokenizer.json (or vocab.json and merges.txt)",
        ) from None
    return (lambda text: auto(text)["input_ids"]), len(auto), str(p)


def _write(
    dst: Path,
    pieces: Iterator[tuple[list[int], int]],
    total_units: int,
    unit: str,
    dtype: Any,
    meta: dict[str, Any],
    progress: bool,
) -> int:
    """Write the ids of ``pieces`` (ids, progress units) to ``dst`` atomically, then FILE.json."""
    from tqdm import tqdm

    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}-", dir=dst.parent)
    total = 0
    try:
        bar = tqdm(
            total=total_units, unit=unit, unit_scale=True, desc="tokenizing", disable=not progress
        )
        with os.fdopen(fd, "wb") as f, bar:
            for ids, units in pieces:
                np.asarray(ids, dtype=dtype).tofile(f)
                total += len(ids)
                bar.update(units)
        meta = {"format": TOKENS_FORMAT, "dtype": np.dtype(dtype).name, **meta}
        meta["num_tokens"] = total
        dst.with_name(dst.name + ".json").write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp_name, dst)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return total


def prepare_from_hf_dataset(
    folder: Path | str,
    column: str,
    out: Path | str,
    tokenizer: Path | str | None = None,
    split: str = "train",
    progress: bool = True,
) -> Prepared:
    """Concatenate ``column`` of a dataset saved to disk into the token file ``out``."""
    from orchestrator.worker.data_hf import open_saved_dataset

    src = Path(folder)
    data = open_saved_dataset(str(src), split, folder_field="--hf-dataset", split_field="--split")
    if column not in data.column_names:
        raise SpecError(
            f"dataset {src} has no column {column!r} (it has {', '.join(data.column_names)})",
            field="--column",
            fix="name the column that holds the text or the token ids",
        )
    feature = str(data.features[column])
    is_text = "string" in feature
    if is_text:
        encode, vocab_size, description = load_tokenizer(tokenizer)
    else:
        # Token ids as they are: the vocabulary is the tokenizer's when named, else max id + 1.
        if tokenizer is not None:
            _, vocab_size, description = load_tokenizer(tokenizer)
        else:
            vocab_size = 1 + max((max(row) for row in data[column] if row), default=0)
            description = "token ids"
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32

    def pieces() -> Iterator[tuple[list[int], int]]:
        for row in data[column]:
            yield (encode(row) if is_text else list(row)), 1

    total = _write(
        Path(out),
        pieces(),
        len(data),
        "rows",
        dtype,
        {"vocab_size": vocab_size, "tokenizer": description, "source": f"{src.name}:{column}"},
        progress,
    )
    return Prepared(
        path=Path(out), num_tokens=total, vocab_size=vocab_size, dtype=np.dtype(dtype).name
    )


def _chunks(path: Path) -> Iterator[tuple[str, int]]:
    """Pieces of the file's text that end at a line end, with their size in bytes."""
    with path.open("rb") as f:
        rest = b""
        while True:
            block = f.read(CHUNK_BYTES)
            if not block:
                break
            block = rest + block
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                rest = block
                continue
            rest = block[cut:]
            yield block[:cut].decode("utf-8", errors="replace"), cut
        if rest:
            yield rest.decode("utf-8", errors="replace"), len(rest)


def prepare_tokens(
    source: Path | str,
    out: Path | str,
    tokenizer: Path | str | None = None,
    progress: bool = True,
    append_eos: bool = False,
) -> Prepared:
    """Tokenize ``source`` (UTF-8 text) into ``out``; a progress bar on stderr when asked."""
    src, dst = Path(source), Path(out)
    if not src.is_file():
        raise SpecError(f"corpus {src} is not a file", field="--input", fix="check the path")
    encode, vocab_size, description = load_tokenizer(tokenizer)
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}-", dir=dst.parent)
    total = 0
    try:
        from tqdm import tqdm

        bar = tqdm(
            total=src.stat().st_size,
            unit="B",
            unit_scale=True,
            desc="tokenizing",
            disable=not progress,
        )
        with os.fdopen(fd, "wb") as f, bar:
            for text, size in _chunks(src):
                ids = encode(text)
                if append_eos:
                    ids = [*ids, vocab_size - 1]
                np.asarray(ids, dtype=dtype).tofile(f)
                total += len(ids)
                bar.update(size)
        meta = {
            "format": TOKENS_FORMAT,
            "dtype": np.dtype(dtype).name,
            "vocab_size": vocab_size,
            "num_tokens": total,
            "tokenizer": description,
            "source": src.name,
        }
        dst.with_name(dst.name + ".json").write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp_name, dst)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return Prepared(path=dst, num_tokens=total, vocab_size=vocab_size, dtype=np.dtype(dtype).name)

"""Tokenize a text corpus into a token file (``orchestrator data prepare``).

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

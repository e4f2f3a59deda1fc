"""Token files: a flat binary of uint16/uint32 token ids (nanoGPT's ``train.bin``), memory-mapped.

The file is cut into windows of ``sequence_length + 1`` tokens, window ``j`` starting at token
``j * sequence_length`` (consecutive windows share one token: the last target of one is the
first input of the next). The last ``validation_fraction`` of the windows is held out.

Sampling is a pure function of (seed, step, position): the global batch of step ``k`` holds the
samples ``k * B .. k * B + B - 1`` of an endless stream that visits every training window once
per epoch, in an order shuffled per epoch from ``(seed, epoch)``. A rank reads only the windows
of its own slice of the batch (the memory map touches nothing else), and a resumed or re-planned
run at step ``k`` sees exactly the samples it would have seen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.errors import SpecError

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
# `orchestrator data prepare` writes FILE.json beside FILE with the tokenizer's vocabulary size.
META_SUFFIX = ".json"


def read_meta(path: Path) -> dict[str, Any] | None:
    """The description `orchestrator data prepare` wrote beside ``path``, if any."""
    meta = path.with_name(path.name + META_SUFFIX)
    if not meta.is_file():
        return None
    try:
        data = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


class TokenFileDataset:
    """Windows of a memory-mapped token file, shuffled per epoch."""

    def __init__(
        self,
        path: Path | str,
        dtype: str,
        sequence_length: int,
        seed: int = 0,
        validation_fraction: float = 0.0,
    ) -> None:
        self.path = Path(path)
        if dtype not in TOKEN_DTYPES:
            raise SpecError(
                f"token dtype {dtype!r} unknown", field="data.dtype", fix="use uint16 or uint32"
            )
        try:
            self.tokens = np.memmap(self.path, dtype=TOKEN_DTYPES[dtype], mode="r")
        except (OSError, ValueError) as exc:
            raise SpecError(
                f"cannot map token file {self.path}: {getattr(exc, 'strerror', None) or exc}",
                field="data.tokens",
                fix="point to a flat binary of token ids (orchestrator data prepare writes one)",
            ) from None
        self.sequence_length = sequence_length
        self.seed = seed
        windows = max(0, (len(self.tokens) - 1) // sequence_length)
        self.num_validation_windows = int(windows * validation_fraction)
        self.num_train_windows = windows - self.num_validation_windows
        self._perms: dict[int, torch.Tensor] = {}

    def check(
        self,
        global_batch_size: int,
        vocab_size: int | None,
        label: str | None = None,
        field: str = "data.tokens",
    ) -> None:
        """One-line errors for a file shorter than one global batch or ids beyond the vocab
        (``label`` and ``field`` name the data as the job wrote it; default: the token file)."""
        what = label or f"token file {self.path}"
        if self.num_train_windows < global_batch_size:
            need = global_batch_size * self.sequence_length + 1
            raise SpecError(
                f"{what} has {len(self.tokens)} tokens ({self.num_train_windows} "
                f"training windows of {self.sequence_length}), fewer than one global batch of "
                f"{global_batch_size} needs ({need} tokens)",
                field=field,
                fix="use a longer file, a smaller global_batch_size, sequence_length or "
                "validation_fraction",
            )
        if vocab_size is None:
            return
        meta = read_meta(self.path)
        if meta is not None and int(meta.get("vocab_size", 0)) > vocab_size:
            raise SpecError(
                f"{what} was made with a tokenizer of {meta['vocab_size']} ids, "
                f"more than the model's vocab_size {vocab_size}",
                field=field,
                fix="prepare the data with the model's own tokenizer",
            )
        # Without a description, look at the head of the file (bounded: 16M ids).
        head = np.asarray(self.tokens[: 1 << 24])
        if head.size and int(head.max()) >= vocab_size:
            raise SpecError(
                f"{what} holds id {int(head.max())}, outside the model's vocab_size {vocab_size}",
                field=field,
                fix="prepare the data with the model's own tokenizer, or check data.dtype",
            )

    def _permutation(self, epoch: int) -> torch.Tensor:
        perm = self._perms.get(epoch)
        if perm is None:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = torch.randperm(self.num_train_windows, generator=generator)
            self._perms = {epoch: perm}  # batches move forward: keep the current epoch only
        return perm

    def window_indices(
        self, step: int, global_batch_size: int, start: int, count: int
    ) -> list[int]:
        """Training windows of positions ``start .. start + count - 1`` of step ``step``."""
        indices = []
        for position in range(start, start + count):
            sample = step * global_batch_size + position
            epoch, offset = divmod(sample, self.num_train_windows)
            indices.append(int(self._permutation(epoch)[offset]))
        return indices

    def _rows(self, windows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        length = self.sequence_length
        rows = np.stack(
            [np.asarray(self.tokens[w * length : w * length + length + 1]) for w in windows]
        ).astype(np.int64)
        data = torch.from_numpy(rows)
        return data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def batch(
        self, step: int, global_batch_size: int, start: int, count: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rows(self.window_indices(step, global_batch_size, start, count))

    def validation_batch(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out windows ``start .. start + count - 1`` (in file order, wrapping around)."""
        if self.num_validation_windows == 0:
            raise SpecError(
                "no validation windows", field="data.validation_fraction", fix="set it above 0"
            )
        first = self.num_train_windows
        windows = [first + (start + i) % self.num_validation_windows for i in range(count)]
        return self._rows(windows)

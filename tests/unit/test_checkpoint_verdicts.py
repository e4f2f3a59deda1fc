"""A checkpoint is hashed once: later verifications reuse the verdict until a file changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from orchestrator.worker import checkpoint
from orchestrator.worker.checkpoint import CheckpointError, save_checkpoint, verify


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    hashed: list[Path] = []
    real = checkpoint._sha256

    def counting(path: Path) -> str:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(checkpoint, "_sha256", counting)
    return hashed


def test_a_verified_checkpoint_is_not_hashed_again(tmp_path: Path, monkeypatch) -> None:
    path = save_checkpoint(tmp_path, 3, {i: {"w": torch.full((4,), float(i))} for i in range(3)})
    checkpoint._VERIFIED.clear()  # as in a new process (writing it already verified it here)
    hashed = _count_hashes(monkeypatch)
    assert verify(path)["step"] == 3
    assert len(hashed) == 3  # every layer file, once
    assert verify(path)["step"] == 3
    assert verify(path)["step"] == 3
    assert len(hashed) == 3  # the verdict was reused


def test_a_changed_file_is_hashed_again_and_caught(tmp_path: Path, monkeypatch) -> None:
    path = save_checkpoint(tmp_path, 1, {i: {"w": torch.zeros(8)} for i in range(2)})
    verify(path)
    hashed = _count_hashes(monkeypatch)
    layer = path / checkpoint.layer_file_name(1)
    data = bytearray(layer.read_bytes())
    data[-1] ^= 0xFF  # same size: only the modification time tells
    layer.write_bytes(bytes(data))
    st = layer.stat()
    os.utime(layer, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(CheckpointError, match="checksum"):
        verify(path)
    assert hashed  # hashed again, not answered from the cache

"""Layer-indexed, atomic checkpoints with a manifest.

Layout under a checkpoint root::

    step-00000120/
        manifest.json          # format, step, plan, layers, sha256 of every file
        layer-0000.pt          # {"params": state_dict, "optimizer": state_dict} of planner layer 0
        layer-0001.pt
        ...
    .tmp-step-00000140-<pid>-<hex>/   # being written; never read, removed when stale

Each planner layer's parameters and optimizer state sit under its layer index, so a plan with
other stage boundaries resumes from them. A checkpoint is written into a temporary directory,
files are fsynced, the manifest is written last, and one ``rename`` publishes the directory: a
reader sees a whole checkpoint or none. A re-save of an existing step publishes the new copy
before the old one is removed, so nothing is ever half-overwritten. On load, a checkpoint whose
manifest is missing or unreadable, or whose files are missing or fail their checksum, is
reported (``CheckpointProblem``) and the previous good one is used.

Writers: the driver can gather ``get_layer_states()`` from the ranks and call
:func:`save_checkpoint`; or each rank writes its own layers into a staging directory
(:func:`begin_checkpoint`, :func:`write_layers`) and one process calls :func:`commit_checkpoint`
with what the writers reported (``written``: file -> checksum and size), so that the committing
process checks sizes and writes the manifest without reading the layers' bytes. The staging
directory must then be on storage every writer and the committer see (one filesystem on one host;
shared storage across hosts).

Readers: :func:`load_latest` reads every layer in one process; or one process resolves a
published checkpoint from its manifest (:func:`layer_files`, no layer read) and hands each reader
a :class:`LayerFiles` naming its layers, which it reads and verifies itself
(:func:`read_layer_files`: the same corruption rules as :func:`verify` and :func:`load_latest`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import PermanentError
from orchestrator.spec.plan import Plan

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "orchestrator-checkpoint/v1"
MANIFEST = "manifest.json"
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-"


class CheckpointError(PermanentError):
    """No usable checkpoint where one was required, or a checkpoint cannot be written."""


@dataclass(frozen=True)
class CheckpointProblem:
    """A checkpoint that was skipped, and why."""

    path: Path
    reason: str


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint, loaded."""

    path: Path
    step: int
    plan: Plan | None
    layer_states: dict[int, dict[str, Any]]
    skipped: tuple[CheckpointProblem, ...] = field(default=())  # newer ones found bad


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def layer_file_name(layer: int) -> str:
    return f"layer-{layer:04d}.pt"


def begin_checkpoint(root: Path, step: int) -> Path:
    """Create and return a fresh staging directory for ``step`` under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f"{TMP_PREFIX}{step_dir_name(step)}-{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir()
    return staging


def write_layers(
    staging: Path, layer_states: Mapping[int, Mapping[str, Any]]
) -> dict[str, tuple[str, int]]:
    """Write each layer's state to ``staging/layer-NNNN.pt`` (temp name, fsync, rename).

    Returns file name -> (sha256, bytes) of what was written, for :func:`commit_checkpoint`.
    """
    import torch  # lazily: the driver may only read manifests

    written: dict[str, tuple[str, int]] = {}
    for layer, state in sorted(layer_states.items()):
        final = staging / layer_file_name(layer)
        tmp = final.with_name(final.name + ".part")
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        # Hashed here, by the writer, from the page cache it just filled: the committing process
        # then need not read every layer's bytes again.
        written[final.name] = (_sha256(tmp), tmp.stat().st_size)
        tmp.rename(final)
    return written


def commit_checkpoint(
    root: Path,
    staging: Path,
    step: int,
    plan: Plan | None,
    num_layers: int,
    keep_last: int = 3,
    written: Mapping[str, tuple[str, int]] | None = None,
) -> Path:
    """Check that all ``num_layers`` layer files are staged, write the manifest, publish.

    ``written`` (file -> sha256 and size, from :func:`write_layers` in the writers): the files'
    sizes are checked against it and its checksums go into the manifest, without hashing here;
    without it every file is hashed here.
    """
    missing = [i for i in range(num_layers) if not (staging / layer_file_name(i)).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint of step {step} lacks layer files {missing} in {staging}; not published"
        )
    names = sorted(p.name for p in staging.glob("layer-*.pt"))
    if written is None:
        files = {name: _sha256(staging / name) for name in names}
    else:
        files = _reported(staging, step, names, written)
    manifest = {
        "format": CHECKPOINT_FORMAT,
        "step": step,
        "num_layers": num_layers,
        "plan": json.loads(plan.to_json()) if plan is not None else None,
        "files": files,
    }
    raw = json.dumps(manifest, indent=1, sort_keys=True)
    _write_file_atomically(staging / MANIFEST, raw)
    _fsync_dir(staging)
    final = root / step_dir_name(step)
    _publish(staging, final)
    if written is not None:
        # The writers' checksums stand for this process's verdict (as a hash of its own would):
        # the prune below and the next restore do not read every layer back.
        _remember_verified(final, raw.encode(), manifest)
    prune(root, keep_last)
    return final


def _reported(
    staging: Path, step: int, names: list[str], written: Mapping[str, tuple[str, int]]
) -> dict[str, str]:
    """File -> sha256 as the writers reported them, after checking that every staged file was
    reported and has the size its writer wrote."""
    files: dict[str, str] = {}
    for name in names:
        if name not in written:
            raise CheckpointError(
                f"checkpoint of step {step}: no writer reported {name} in {staging}; not published"
            )
        digest, size = written[name]
        actual = (staging / name).stat().st_size
        if actual != int(size):
            raise CheckpointError(
                f"checkpoint of step {step}: {name} has {actual} bytes, its writer wrote {size}; "
                "not published"
            )
        files[name] = str(digest)
    return files


def _remember_verified(path: Path, raw: bytes, manifest: dict[str, Any]) -> None:
    stats = []
    for name in sorted(manifest["files"]):
        st = (path / name).stat()
        stats.append((name, st.st_size, st.st_mtime_ns))
    _VERIFIED[(str(path.resolve()), hashlib.sha256(raw).hexdigest())] = (
        tuple(stats),
        dict(manifest),
    )


def save_checkpoint(
    root: Path,
    step: int,
    layer_states: dict[int, dict[str, Any]],
    plan: Plan | None = None,
    keep_last: int = 3,
) -> Path:
    """Write a whole checkpoint of ``layer_states`` (every planner layer) for ``step``."""
    staging = begin_checkpoint(root, step)
    try:
        write_layers(staging, layer_states)
        return commit_checkpoint(root, staging, step, plan, len(layer_states), keep_last)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def list_checkpoints(root: Path) -> list[Path]:
    """Published checkpoint directories, newest step first."""
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX)]
    return sorted(dirs, key=lambda p: p.name, reverse=True)


# Verdicts of checkpoints that verified, by (folder, manifest checksum): recovery and ``status``
# ask for the newest checkpoint on every call, and re-hashing a 100 GB checkpoint each time would
# cost minutes. A cached verdict holds while every listed file keeps its size and modification
# time; a rewritten or truncated file changes them and is hashed again. Failures are not cached.
_VERIFIED: dict[tuple[str, str], tuple[tuple[tuple[str, int, int], ...], dict[str, Any]]] = {}


def verify(path: Path) -> dict[str, Any]:
    """Return the manifest of ``path`` if every file is present and matches its checksum.

    Each checkpoint is hashed once per process: a later call with the same manifest and unchanged
    files returns the cached verdict (see ``_VERIFIED``).
    """
    raw, manifest = _read_manifest(path)
    stats = []
    for name in sorted(manifest["files"]):
        try:
            st = (path / name).stat()
        except OSError:
            raise CheckpointError(f"{path}: {name} is missing") from None
        stats.append((name, st.st_size, st.st_mtime_ns))
    key = (str(path.resolve()), hashlib.sha256(raw).hexdigest())
    cached = _VERIFIED.get(key)
    if cached is not None and cached[0] == tuple(stats):
        return dict(cached[1])
    for name, digest in sorted(manifest["files"].items()):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if _sha256(file) != digest:
            raise CheckpointError(f"{path}: {name} fails its sha256 checksum (corrupt)")
    expected = {layer_file_name(i) for i in range(manifest["num_layers"])}
    if not expected <= set(manifest["files"]):
        raise CheckpointError(f"{path}: manifest lists too few layer files")
    _VERIFIED[key] = (tuple(stats), dict(manifest))
    return dict(manifest)


def _read_manifest(path: Path) -> tuple[bytes, dict[str, Any]]:
    """The raw bytes and the parsed manifest of ``path`` (its format checked)."""
    try:
        raw = (path / MANIFEST).read_bytes()
        manifest = json.loads(raw)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no {MANIFEST} (partial checkpoint)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable {MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise CheckpointError(f"{path}: format {found!r}, not {CHECKPOINT_FORMAT}")
    return raw, manifest


@dataclass(frozen=True)
class LayerFiles:
    """Where layers of a published checkpoint are read: its directory and, per planner layer,
    the file name and the sha256 its manifest lists. Plain data, small: the controller resolves
    it from the manifest (:func:`layer_files`) and hands each rank the part naming its own
    layers (:meth:`for_layers`); the rank reads and verifies them (:func:`read_layer_files`)."""

    path: str
    step: int
    files: dict[int, tuple[str, str]]  # planner layer -> (file name, sha256)

    def for_layers(self, layers: Iterable[int]) -> LayerFiles:
        """The same checkpoint, naming only ``layers``."""
        wanted = sorted(set(layers))
        missing = [i for i in wanted if i not in self.files]
        if missing:
            raise CheckpointError(f"{self.path}: the manifest lists no files for layers {missing}")
        return LayerFiles(self.path, self.step, {i: self.files[i] for i in wanted})


def layer_files(path: Path) -> LayerFiles:
    """The checkpoint at ``path`` resolved from its manifest, without reading any layer file:
    its readers verify each file they read (:func:`read_layer_files`). A missing, unreadable or
    foreign manifest, or one that lists too few layer files, raises :class:`CheckpointError`."""
    _raw, manifest = _read_manifest(path)
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise CheckpointError(f"{path}: {MANIFEST} lists no files")
    files: dict[int, tuple[str, str]] = {}
    for i in range(int(manifest["num_layers"])):
        name = layer_file_name(i)
        if name not in listed:
            raise CheckpointError(f"{path}: manifest lists too few layer files")
        files[i] = (name, str(listed[name]))
    return LayerFiles(str(path), int(manifest["step"]), files)


def read_layer_files(ref: LayerFiles) -> dict[int, dict[str, Any]]:
    """Every layer ``ref`` names, read by this process: each file is read once, its bytes
    hashed against the manifest's sha256, then loaded (``torch.load(..., weights_only=True)``).
    A missing file, a checksum mismatch or a file that will not load raises
    :class:`CheckpointError` naming the file; nothing of such a file is returned."""
    import io

    import torch

    states: dict[int, dict[str, Any]] = {}
    for layer, (name, digest) in sorted(ref.files.items()):
        file = Path(ref.path) / name
        try:
            raw = file.read_bytes()
        except OSError:
            raise CheckpointError(f"{ref.path}: {name} is missing") from None
        if hashlib.sha256(raw).hexdigest() != digest:
            raise CheckpointError(f"{ref.path}: {name} fails its sha256 checksum (corrupt)")
        try:
            states[layer] = torch.load(io.BytesIO(raw), weights_only=True)
        except Exception as exc:  # a file that verifies but will not load is corrupt too
            raise CheckpointError(f"{ref.path}: {name} does not load: {exc}") from None
    return states


def load_latest(root: Path) -> Checkpoint | None:
    """The newest checkpoint that verifies; bad newer ones are logged and listed in ``skipped``.

    Returns None when ``root`` holds no checkpoint at all; raises :class:`CheckpointError` when
    it holds some but none verifies.
    """
    problems: list[CheckpointProblem] = []
    candidates = list_checkpoints(root)
    for path in candidates:
        try:
            manifest = verify(path)
            states = _read_layers(path, manifest["num_layers"])
        except CheckpointError as exc:
            log.warning("skipping checkpoint: %s", exc)
            problems.append(CheckpointProblem(path=path, reason=str(exc)))
            continue
        plan = Plan.model_validate(manifest["plan"]) if manifest.get("plan") else None
        return Checkpoint(path, manifest["step"], plan, states, tuple(problems))
    if candidates:
        reasons = "; ".join(p.reason for p in problems)
        raise CheckpointError(f"no usable checkpoint under {root}: {reasons}")
    return None


def prune(root: Path, keep_last: int) -> None:
    """Keep the newest ``keep_last`` good checkpoints; remove older ones and stale staging dirs."""
    good = 0
    for path in list_checkpoints(root):
        try:
            verify(path)
        except CheckpointError:
            continue  # keep bad ones for inspection; they are skipped on load
        good += 1
        if good > keep_last:
            shutil.rmtree(path, ignore_errors=True)
    for tmp in root.glob(f"{TMP_PREFIX}*"):
        if tmp.is_dir() and not _owned_by_live_process(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _read_layers(path: Path, num_layers: int) -> dict[int, dict[str, Any]]:
    import torch

    states: dict[int, dict[str, Any]] = {}
    for i in range(num_layers):
        try:
            states[i] = torch.load(path / layer_file_name(i), weights_only=True)
        except Exception as exc:  # a file that verifies but will not load is corrupt too
            raise CheckpointError(f"{path}: {layer_file_name(i)} does not load: {exc}") from None
    return states


def _publish(staging: Path, final: Path) -> None:
    if not final.exists():
        staging.rename(final)
        _fsync_dir(final.parent)
        return
    # Re-save of a step: move the old copy aside, publish the new one, then drop the old.
    aside = final.with_name(f"{TMP_PREFIX}old-{final.name}-{os.getpid()}-{secrets.token_hex(4)}")
    final.rename(aside)
    staging.rename(final)
    _fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def _owned_by_live_process(tmp: Path) -> bool:
    parts = tmp.name.split("-")
    try:
        pid = int(parts[-2])
    except (IndexError, ValueError):
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_file_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

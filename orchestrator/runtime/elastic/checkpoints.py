"""The controller's :class:`~orchestrator.control.ports.CheckpointStore` implementations.

:class:`DirCheckpointStore` writes the worker side's layer-indexed, atomic checkpoints
(``orchestrator/worker/checkpoint.py``) and adds the controller's run state (failures so far, lost
steps, measured slowdowns, the plan) as ``run-state.json`` inside the checkpoint directory, staged
with the layers so the one ``rename`` that publishes the checkpoint publishes it too.

The layers' holders write their own layer files: the controller calls
:meth:`DirCheckpointStore.begin` for a staging directory, the worker port has each layer's writer
write into it (``group_port.py``), and :meth:`DirCheckpointStore.commit` checks the files against
the writers' reports and publishes them with the manifest. The controller never holds a layer's
state on that path; the checkpoint directory must therefore be storage every worker sees (the
local disk on one host, shared storage such as NFS for a run across hosts). A restore is read
the same way: :meth:`DirCheckpointStore.layer_files` resolves the manifest into a reference (the
directory, each layer's file and sha256) and the ranks read and verify their own layers
(``restore.py``). :meth:`DirCheckpointStore.save` (states in hand) and
:meth:`DirCheckpointStore.load` remain for callers that have or want the states in one process.

:class:`MemoryCheckpointStore` keeps the newest checkpoint in memory, for jobs without a
checkpoint directory (a restarted controller then starts over); its states pass through the
controller, which holds them, and a restore from it sends them from the controller to the ranks.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.control.recovery import CheckpointRef, LayerState
from orchestrator.spec.plan import Plan

if TYPE_CHECKING:
    from orchestrator.worker.checkpoint import LayerFiles

RUN_STATE_FILE = "run-state.json"


class DirCheckpointStore:
    """Checkpoints under ``root``; ``resume=False`` ignores those that were there before.

    ``on_skipped(path, reason)`` hears once of each published checkpoint that fails to verify.
    """

    def __init__(
        self,
        root: Path,
        *,
        keep_last: int = 3,
        resume: bool = True,
        on_skipped: Callable[[Path, str], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        self._ignored: set[str] = set() if resume else {p.name for p in self._published()}
        self._on_skipped = on_skipped

    def _published(self) -> list[Path]:
        from orchestrator.worker.checkpoint import list_checkpoints

        return list_checkpoints(self.root)

    def latest(self) -> CheckpointRef | None:
        """The newest checkpoint that verifies (bad newer ones are skipped), with its run state
        under ``manifest["meta"]``."""
        from orchestrator.worker.checkpoint import CheckpointError, verify

        for path in self._published():
            if path.name in self._ignored:
                continue
            try:
                manifest = verify(path)
            except CheckpointError as exc:
                self._ignored.add(path.name)  # a bad checkpoint stays bad: verify it once
                if self._on_skipped is not None:
                    self._on_skipped(path, str(exc))
                continue
            return CheckpointRef(int(manifest["step"]), {**manifest, "meta": _read_meta(path)})
        return None

    def save(
        self, step: int, states: Mapping[int, LayerState], meta: Mapping[str, object]
    ) -> CheckpointRef:
        """Write every layer and the run state for ``step``; publish atomically."""
        from orchestrator.worker.checkpoint import begin_checkpoint, write_layers

        staging = begin_checkpoint(self.root, step)
        try:
            write_layers(staging, {int(k): v for k, v in states.items()})  # type: ignore[misc]
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return self._publish(step, staging, meta, len(states), written=None)

    def begin(self, step: int) -> str:
        """A fresh staging directory for ``step``, for the workers to write their layers into."""
        from orchestrator.worker.checkpoint import begin_checkpoint

        return str(begin_checkpoint(self.root, step))

    def commit(
        self, step: int, staging: str, written: Mapping[str, object], meta: Mapping[str, object]
    ) -> CheckpointRef:
        """Check the staged layer files against the writers' reports (file -> sha256, bytes),
        add the run state and publish atomically; on any error the staging directory goes and
        nothing is published."""
        plan = _plan_of(meta)
        num_layers = plan.num_layers if plan is not None else len(written)
        reports = {str(k): (str(v[0]), int(v[1])) for k, v in written.items()}  # type: ignore[index]
        return self._publish(step, Path(staging), meta, num_layers, written=reports)

    def _publish(
        self,
        step: int,
        staging: Path,
        meta: Mapping[str, object],
        num_layers: int,
        written: dict[str, tuple[str, int]] | None,
    ) -> CheckpointRef:
        """Add the run state to ``staging`` and publish it as the checkpoint at ``step`` (its
        files hashed here, or checked against the writers' ``written`` reports); on any error
        the staging directory goes and nothing is published."""
        from orchestrator.worker.checkpoint import commit_checkpoint

        try:
            _write_json_atomically(staging / RUN_STATE_FILE, dict(meta))
            final = commit_checkpoint(
                self.root,
                staging,
                step,
                _plan_of(meta),
                num_layers,
                keep_last=self.keep_last,
                written=written,
            )
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._ignored.discard(final.name)
        return CheckpointRef(step, {"path": str(final), "step": step, "meta": dict(meta)})

    def abort(self, staging: str) -> None:
        """Remove a staging directory that will not be committed."""
        shutil.rmtree(staging, ignore_errors=True)

    def layer_files(self, step: int) -> LayerFiles:
        """The checkpoint at ``step`` as a reference for its readers (directory, each layer's
        file and sha256 from the manifest); no layer file is read here. A restore hands each
        rank the part naming its layers, and the rank reads and verifies them itself."""
        from orchestrator.worker.checkpoint import layer_files, step_dir_name

        return layer_files(self.root / step_dir_name(step))

    def load(self, step: int) -> dict[int, LayerState]:
        """Every layer's state of the checkpoint at ``step`` (verified first), read into this
        process (tools; a restore has the ranks read their own layers: :meth:`layer_files`)."""
        import torch

        from orchestrator.worker.checkpoint import layer_file_name, step_dir_name, verify

        path = self.root / step_dir_name(step)
        manifest = verify(path)
        return {
            i: torch.load(path / layer_file_name(i), weights_only=True)
            for i in range(int(manifest["num_layers"]))
        }


class MemoryCheckpointStore:
    """The newest checkpoint, held in this process (for jobs without a checkpoint directory)."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._states: dict[int, LayerState] = {}
        self._meta: dict[str, object] = {}

    def latest(self) -> CheckpointRef | None:
        if self._step is None:
            return None
        return CheckpointRef(self._step, {"step": self._step, "meta": dict(self._meta)})

    def save(
        self, step: int, states: Mapping[int, LayerState], meta: Mapping[str, object]
    ) -> CheckpointRef:
        self._step, self._states, self._meta = step, dict(states), dict(meta)
        return CheckpointRef(step, {"step": step, "meta": dict(meta)})

    def load(self, step: int) -> dict[int, LayerState]:
        if step != self._step:
            raise KeyError(f"no checkpoint at step {step} in memory (newest: {self._step})")
        return dict(self._states)


def _plan_of(meta: Mapping[str, object]) -> Plan | None:
    """The plan a checkpoint's run state carries (None: a fixed-plan run's, or none)."""
    plan_json = meta.get("plan")
    return Plan.model_validate(plan_json) if isinstance(plan_json, dict) else None


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads((path / RUN_STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}  # a checkpoint written by a fixed-plan run: no run state, layers still good
    return meta if isinstance(meta, dict) else {}


def _write_json_atomically(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)

"""Checkpoints written by the layers' holders into a directory store.

With a worker port that writes checkpoints (``WritesCheckpoints``) and a store that stages them
(``DirCheckpointStore``), the controller begins a staging directory, the fake workers write their
layers' files into it (``worker/checkpoint.write_layers``, as the Ray actors do), and the
controller commits the manifest: no layer state comes back to the controller. A lost worker or a
failed write during it publishes nothing and leaves no staging directory behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from control_fakes import NUM_LAYERS, make_harness
from test_keep_survivors import KeepingWorkerGroup

from orchestrator.control.ports import StagesCheckpoints, WritesCheckpoints
from orchestrator.runtime.elastic.checkpoints import DirCheckpointStore
from orchestrator.worker.checkpoint import (
    TMP_PREFIX,
    CheckpointError,
    begin_checkpoint,
    commit_checkpoint,
    list_checkpoints,
    write_layers,
)


class WritingWorkerGroup(KeepingWorkerGroup):
    """Keeps its survivors and writes each layer from the rank the controller names."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[dict[int, int]] = []
        self.lose_after_layers: int | None = None  # the writer's node dies after N layer files
        self.fail_after_layers: int | None = None  # the disk fills after N layer files

    def write_checkpoint(self, staging: str, sources):
        self.writes.append(dict(sources))
        self.clock.advance(self.fetch_s)
        self._raise_if_dead(set(sources.values()))
        written: dict[str, object] = {}
        for n, (layer, rank) in enumerate(sorted(sources.items())):
            if n == self.lose_after_layers:
                self.lose_after_layers = None
                self.cluster.kill(self.rank_node[rank])
                self._raise_if_dead({rank})
            if n == self.fail_after_layers:
                self.fail_after_layers = None
                raise OSError("No space left on device")
            written.update(write_layers(Path(staging), {layer: self.state[rank][layer]}))
        return written


def _harness(tmp_path: Path, **config):
    store = DirCheckpointStore(tmp_path)
    h = make_harness([("a", "A100-80", 2), ("b", "A100-80", 2)], store=store, **config)
    writing = WritingWorkerGroup(h.cluster, h.clock, store)
    h.controller.ctx.workers = writing
    h.workers = writing
    return h, store


def _staging_left(root: Path) -> list[Path]:
    return list(root.glob(f"{TMP_PREFIX}*"))


def test_the_ports_are_recognised():
    h, store = _harness(Path("/nonexistent"))
    assert isinstance(h.workers, WritesCheckpoints) and isinstance(store, StagesCheckpoints)
    assert h.controller.ctx.holders_write


def test_holders_write_every_checkpoint_and_the_controller_reads_no_layer(tmp_path):
    h, store = _harness(tmp_path, total_steps=20, checkpoint_interval_steps=5)
    h.states_until(lambda c: c.done)
    assert h.controller.state.name == "finished", h.controller.events[-1].message
    assert h.workers.fetches == 0  # no layer state came through the controller
    assert len(h.workers.writes) == 4  # steps 5, 10, 15 and the final one at 20
    latest = store.latest()
    assert latest is not None and latest.step == 20
    assert latest.manifest["meta"]["plan"] is not None  # the run state went in with the layers
    assert store.load(20) == {i: tuple(range(20)) for i in range(NUM_LAYERS)}
    assert store.load(15) == {i: tuple(range(15)) for i in range(NUM_LAYERS)}
    assert _staging_left(tmp_path) == []


def test_a_writer_lost_during_the_write_publishes_nothing(tmp_path):
    h, store = _harness(tmp_path, total_steps=20, checkpoint_interval_steps=5)
    h.workers.lose_after_layers = 2  # during the checkpoint of step 5, two files written
    h.states_until(lambda c: c.done)
    c = h.controller
    assert c.state.name == "finished", c.events[-1].message
    assert c.failure_count == 1
    assert any("failure 1 at step 5" in e.message for e in c.events)
    published = sorted(int(p.name.split("-")[1]) for p in list_checkpoints(tmp_path))
    assert 5 not in published  # the half-written checkpoint of step 5 was never published
    assert published[-1] == 20
    assert store.load(20) == {i: tuple(range(20)) for i in range(NUM_LAYERS)}
    assert _staging_left(tmp_path) == []
    assert h.workers.fetches == 0


def test_a_failed_write_is_recorded_and_the_run_goes_on(tmp_path):
    h, _ = _harness(tmp_path, total_steps=20, checkpoint_interval_steps=5)
    h.workers.fail_after_layers = 1
    h.states_until(lambda c: c.done)
    c = h.controller
    assert c.state.name == "finished"
    assert c.failure_count == 0
    assert any("checkpoint at step 5 failed" in e.message for e in c.events)
    published = sorted(int(p.name.split("-")[1]) for p in list_checkpoints(tmp_path))
    assert published == [10, 15, 20]
    assert _staging_left(tmp_path) == []


def test_a_commit_refuses_files_its_writers_did_not_report_or_wrote_otherwise(tmp_path):
    staging = begin_checkpoint(tmp_path, 3)
    written = write_layers(staging, {0: {"a": 1}, 1: {"b": 2}})
    only_first = {"layer-0000.pt": written["layer-0000.pt"]}
    with pytest.raises(CheckpointError, match=r"no writer reported layer-0001\.pt"):
        commit_checkpoint(tmp_path, staging, 3, None, 2, written=only_first)
    digest, size = written["layer-0001.pt"]
    with pytest.raises(CheckpointError, match="its writer wrote"):
        commit_checkpoint(
            tmp_path, staging, 3, None, 2, written={**written, "layer-0001.pt": (digest, size + 1)}
        )
    assert list_checkpoints(tmp_path) == []
    final = commit_checkpoint(tmp_path, staging, 3, None, 2, written=written)
    assert [p.name for p in list_checkpoints(tmp_path)] == [final.name]

"""A restore from a checkpoint directory is read by the ranks, not by the controller.

The real ``DirCheckpointStore`` holds a checkpoint; the controller side is the real port's
``_states_for`` and ``restore.py``; each rank is a real ``ElasticWorker`` (its Ray-free class)
over an engine made of the real ``LayerStates`` import with torch layers and Adam optimizers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.control.recovery import CheckpointRef, RestoreSource
from orchestrator.runtime.actor import WorkerJob
from orchestrator.runtime.elastic.checkpoints import DirCheckpointStore, MemoryCheckpointStore
from orchestrator.runtime.elastic.group_port import RayWorkerGroupPort
from orchestrator.runtime.elastic.restore import (
    checkpoint_errors,
    checkpoint_incoming,
    launch_group,
    read_by_holders,
    resolve_incoming,
)
from orchestrator.runtime.elastic.worker import ElasticWorker
from orchestrator.runtime.errors import WorkerFailedError
from orchestrator.spec.plan import Plan
from orchestrator.worker.checkpoint import CheckpointError, LayerFiles
from orchestrator.worker.layer_states import LayerStates
from orchestrator.worker.topology import RankSpec, ranks_for_plan

NUM_LAYERS = 4
STEP = 6
# Replica 0: layers 0-1 on rank 0, 2-3 on rank 1; replica 1: every layer on rank 2.
PLAN = Plan.model_validate(
    {
        "global_batch_size": 4,
        "microbatch_size": 1,
        "replicas": [
            {
                "batch_size": 2,
                "stages": [
                    {"layers": [0, 2], "device_type": "A"},
                    {"layers": [2, 4], "device_type": "A"},
                ],
            },
            {"batch_size": 2, "stages": [{"layers": [0, 4], "device_type": "A"}]},
        ],
    }
)


class Engine(LayerStates):
    """A rank's layers and optimizers, with the engine's real state import (tp 1)."""

    def __init__(self, spec: RankSpec, seed: int) -> None:
        torch.manual_seed(seed)
        self.spec, self.scaling, self.sharding = spec, None, None
        self.layers = {i: torch.nn.Linear(4, 4) for i in spec.layer_indices}
        self.optimizers = {
            i: torch.optim.Adam(layer.parameters(), lr=1e-2) for i, layer in self.layers.items()
        }


def trained_states() -> dict[int, dict[str, Any]]:
    """Every layer after a few Adam steps (optimizer state not empty)."""
    spec = next(s for s in ranks_for_plan(PLAN) if s.rank == 2)  # holds every layer
    engine = Engine(spec, seed=7)
    for _ in range(3):
        for i, layer in engine.layers.items():
            layer(torch.randn(2, 4)).square().sum().backward()
            engine.optimizers[i].step()
            engine.optimizers[i].zero_grad()
    return engine.get_layer_states()


class NoLoadStore(DirCheckpointStore):
    """The real directory store whose controller-side read of the layers is refused."""

    def load(self, step: int) -> dict[int, Any]:
        raise AssertionError("the controller read the checkpoint's layers")


class Handle:
    """Stands in for a Ray actor handle: ``handle.method.remote(...)`` runs the call here."""

    def __init__(self, worker: ElasticWorker) -> None:
        self.worker = worker

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.worker, name)
        call = type("M", (), {"remote": staticmethod(method)})()
        call.options = lambda **_: call  # num_returns=2: the method's tuple is the two refs
        return call


class FakeGroup:
    """The group surface ``launch_group`` uses: launch, ranks, actors, gather, stop."""

    options = type("O", (), {"rendezvous_timeout_s": 5.0})()

    def __init__(self) -> None:
        self.launched_with: list[Any] = []
        self.stopped = False

    def launch(self, plan: Plan, states: Any, start_step: int) -> list[Any]:
        self.launched_with.append(states)
        self.ranks = ranks_for_plan(plan)
        self._actors = [Handle(worker_for(spec, seed=100 + spec.rank)) for spec in self.ranks]
        return []

    def _gather(self, phase: str, refs: dict[int, Any], timeout_s: float) -> dict[int, Any]:
        return dict(refs)  # the calls ran already (Handle)

    def stop(self) -> None:
        self.stopped = True


def worker_for(spec: RankSpec, seed: int) -> ElasticWorker:
    worker = ElasticWorker.__new__(ElasticWorker)  # the actor's class, without Ray
    worker._engine = Engine(spec, seed)
    return worker


@pytest.fixture
def store(tmp_path: Path) -> NoLoadStore:
    s = NoLoadStore(tmp_path / "ckpt")
    s.save(STEP, trained_states(), {"failures": 0})
    return s


def restore() -> RestoreSource:
    return RestoreSource.from_checkpoint(CheckpointRef(STEP, {}), STEP + 2, NUM_LAYERS)


def port_on(store: DirCheckpointStore | MemoryCheckpointStore) -> RayWorkerGroupPort:
    return RayWorkerGroupPort(WorkerJob("m:f", {}, {}), store)


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_the_controller_resolves_a_reference_and_reads_no_layer(store: NoLoadStore) -> None:
    source = port_on(store)._states_for(restore())
    assert isinstance(source, LayerFiles)
    manifest = (store.root / f"step-{STEP:08d}" / "manifest.json").read_text()
    assert source.step == STEP and Path(source.path) == store.root / f"step-{STEP:08d}"
    assert sorted(source.files) == list(range(NUM_LAYERS))
    for name, digest in source.files.values():
        assert f'"{name}": "{digest}"' in manifest  # the manifest's own checksums


def test_a_fresh_launch_has_every_rank_read_its_own_layers(store: NoLoadStore) -> None:
    group = FakeGroup()
    launch_group(group, PLAN, port_on(store)._states_for(restore()), STEP)
    assert group.launched_with == [None]  # no state went with the launch
    saved = DirCheckpointStore(store.root).load(STEP)
    for spec, handle in zip(group.ranks, group._actors, strict=True):
        got = handle.worker._engine.get_layer_states()
        assert sorted(got) == list(spec.layer_indices)
        for i in spec.layer_indices:
            assert_same(got[i], saved[i])


def test_a_reform_sends_each_rank_only_the_reference_to_its_layers(store: NoLoadStore) -> None:
    source = port_on(store)._states_for(restore())
    assert isinstance(source, LayerFiles)
    ranks = ranks_for_plan(PLAN)
    incoming: list[list[Any]] = [[] for _ in ranks]
    assert checkpoint_incoming(source, ranks, incoming, actors=[]) == 2 + 2 + 4
    for spec in ranks:
        (ref,) = incoming[spec.rank]
        assert isinstance(ref, LayerFiles) and sorted(ref.files) == list(spec.layer_indices)
        parts = resolve_incoming(incoming[spec.rank])  # in the actor: read and verified there
        assert [sorted(p) for p in parts] == [list(spec.layer_indices)]


def test_restored_through_the_ranks_equals_the_controllers_read(store: NoLoadStore) -> None:
    """The old path: the controller loads every layer and gives each rank its own; the new:
    the rank reads its files. Same parameters and optimizer state, and the same next step."""
    states = DirCheckpointStore(store.root).load(STEP)  # what the old path handed the ranks
    source = port_on(store)._states_for(restore())
    assert isinstance(source, LayerFiles)
    for spec in ranks_for_plan(PLAN):
        old = Engine(spec, seed=1)
        old.set_layer_states({i: states[i] for i in spec.layer_indices})
        new = worker_for(spec, seed=2)
        assert new.load_checkpoint_layers(source.for_layers(spec.layer_indices)) > 0
        assert_same(new._engine.get_layer_states(), old.get_layer_states())
        for i in spec.layer_indices:  # and the optimizer continues alike
            x = torch.randn(3, 4)
            for engine in (old, new._engine):
                engine.layers[i](x).sum().backward()
                engine.optimizers[i].step()
        assert_same(new._engine.get_layer_states(), old.get_layer_states())


class Recorder:
    """A rank's actor that records what it reads and is given (its engine at tp 2 is not
    needed for who reads what)."""

    def __init__(self, rank: int, log: list[tuple[str, int, Any]]) -> None:
        self.rank, self.log = rank, log

    def read_checkpoint_layers(self, files: LayerFiles) -> tuple[Any, int]:
        self.log.append(("read", self.rank, sorted(files.files)))
        return ElasticWorker.read_checkpoint_layers(self, files)  # type: ignore[arg-type]

    def load_checkpoint_layers(self, files: LayerFiles) -> int:
        self.log.append(("read+load", self.rank, sorted(files.files)))
        return 1

    def set_layer_states(self, states: dict[int, Any]) -> None:
        self.log.append(("load", self.rank, states))


TP_PLAN = Plan.model_validate(
    {
        "global_batch_size": 2,
        "microbatch_size": 1,
        "replicas": [
            {
                "batch_size": 2,
                "stages": [
                    {"layers": [0, 1], "device_type": "A"},
                    {"layers": [1, 4], "device_type": "A", "tp": 2},
                ],
            }
        ],
    }
)


def test_a_tp_stage_reads_its_files_once_for_all_its_ranks(store: NoLoadStore) -> None:
    source = port_on(store)._states_for(restore())
    assert isinstance(source, LayerFiles)
    ranks = ranks_for_plan(TP_PLAN)
    assert [s.tp for s in ranks] == [1, 2, 2]
    log: list[tuple[str, int, Any]] = []
    group = FakeGroup()
    group.ranks, group._actors = ranks, [Handle(Recorder(r, log)) for r in range(3)]  # type: ignore[arg-type]
    read_by_holders(group, source, 5.0)
    reads = [(kind, rank, what) for kind, rank, what in log if kind != "load"]
    assert reads == [("read+load", 0, [0]), ("read", 1, [1, 2, 3])]  # once per copy
    loads = {rank: what for kind, rank, what in log if kind == "load"}
    assert sorted(loads) == [1, 2] and loads[1] is loads[2]  # one object for the stage
    saved = DirCheckpointStore(store.root).load(STEP)
    assert_same(loads[1], {i: saved[i] for i in (1, 2, 3)})
    # A re-formation into the same plan: the tp ranks are sent the reader's one object.
    log.clear()
    incoming: list[list[Any]] = [[] for _ in ranks]
    checkpoint_incoming(source, ranks, incoming, group._actors)
    assert [kind for kind, _, _ in log] == ["read"]
    assert isinstance(incoming[0][0], LayerFiles) and incoming[1][0] is incoming[2][0]


def test_a_corrupt_layer_file_is_refused_by_the_rank_naming_it(store: NoLoadStore) -> None:
    source = port_on(store)._states_for(restore())
    assert isinstance(source, LayerFiles)
    file = Path(source.path) / "layer-0003.pt"
    raw = bytearray(file.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only the checksum tells
    file.write_bytes(bytes(raw))
    spec = next(s for s in ranks_for_plan(PLAN) if s.rank == 2)
    worker = worker_for(spec, seed=3)
    before = worker._engine.get_layer_states()
    with pytest.raises(CheckpointError, match=r"layer-0003\.pt fails its sha256 checksum"):
        worker.load_checkpoint_layers(source.for_layers(spec.layer_indices))
    assert_same(worker._engine.get_layer_states(), before)  # nothing of it loaded
    # The rank holding layers 0-1 only reads its own files: unaffected.
    first = next(s for s in ranks_for_plan(PLAN) if s.rank == 0)
    assert worker_for(first, seed=3).load_checkpoint_layers(source.for_layers((0, 1))) > 0


def test_a_missing_layer_file_is_refused_naming_it(store: NoLoadStore) -> None:
    source = port_on(store)._states_for(restore())
    assert isinstance(source, LayerFiles)
    (Path(source.path) / "layer-0001.pt").unlink()
    with pytest.raises(CheckpointError, match=r"layer-0001\.pt is missing"):
        resolve_incoming([source.for_layers([0, 1])])


def test_a_manifest_listing_too_few_files_is_refused_by_the_controller(
    store: NoLoadStore,
) -> None:
    manifest = store.root / f"step-{STEP:08d}" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"layer-0002.pt"', '"other.pt"'))
    with pytest.raises(CheckpointError, match="too few layer files"):
        port_on(store)._states_for(restore())


def test_a_ranks_checkpoint_error_reaches_the_controller_as_one() -> None:
    class Remote(Exception):
        def __init__(self, cause: BaseException) -> None:
            self.cause = cause

    try:
        raise WorkerFailedError("read checkpoint layers", 2, "CheckpointError: ...") from Remote(
            CheckpointError("/c/step-6: layer-0003.pt fails its sha256 checksum (corrupt)")
        )
    except WorkerFailedError as exc:
        failure = exc
    expected = r"^rank 2 reading the checkpoint: .*layer-0003"
    with pytest.raises(CheckpointError, match=expected), checkpoint_errors():
        raise failure
    other = WorkerFailedError("step 3", 1, "ValueError: bad")
    with pytest.raises(WorkerFailedError), checkpoint_errors():
        raise other


def test_the_in_memory_store_still_hands_its_states(tmp_path: Path) -> None:
    memory = MemoryCheckpointStore()
    memory.save(STEP, trained_states(), {})
    source = port_on(memory)._states_for(restore())
    assert not isinstance(source, LayerFiles) and sorted(source) == list(range(NUM_LAYERS))

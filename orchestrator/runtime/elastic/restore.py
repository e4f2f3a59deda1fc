"""Restores from a checkpoint, read by the ranks that need the layers, not by the controller.

A directory checkpoint (:class:`~orchestrator.runtime.elastic.checkpoints.DirCheckpointStore`)
is resolved by the controller into a :class:`~orchestrator.worker.checkpoint.LayerFiles`
reference: the checkpoint's directory and, per layer, the file name and sha256 its manifest lists.
Each rank is handed the part naming its own layers, reads those files itself, checks every
file's sha256 against the manifest (a missing, corrupt or unloadable file is an error naming it,
never loaded) and cuts the whole per-layer state for its tensor-parallel position or shard slice
as any state given to it is cut (``set_layer_states``; in a re-formation, ``ElasticWorker.reform``).
No layer's bytes pass through the controller; the checkpoint directory must be storage every
worker sees, as for writing.

Each copy of a layer is read from storage once: a rank at tp 1 reads its own files, and the
ranks of a tensor-parallel stage (one node) have the stage's first rank read the stage's files
once (``ElasticWorker.read_checkpoint_layers``); the whole states it read go to every rank of the
stage as one Ray object, from that node's object store, never through the controller (which
holds only the reference). Without that, each of a tp-8 stage's ranks would read the same files
from storage: eight times the bytes.

The in-memory store (:class:`~orchestrator.runtime.elastic.checkpoints.MemoryCheckpointStore`)
has no files: its states are in the controller's memory already and go from there to the ranks
(one Ray object per layer), as before.

Where the reads happen:

- A fresh group (:func:`launch_group`): the group is launched without states, then every rank
  reads its layers (:func:`read_by_holders`) and loads them after its set-up.
- A re-formation from the checkpoint (``ElasticWorkerGroup.reform``, survivors kept): each rank
  of the new plan is sent the reference for its layers instead of Ray objects
  (:func:`checkpoint_incoming`), and resolves it where it joins the parts it is sent
  (:func:`resolve_incoming`, in the actor).

A rank's :class:`~orchestrator.worker.checkpoint.CheckpointError` comes back to the controller as
a ``CheckpointError`` naming the rank and the file (:func:`checkpoint_errors`), as the
controller's own read raised it before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from orchestrator.control.ports import CheckpointStore
from orchestrator.runtime.errors import WorkerFailedError
from orchestrator.runtime.group import WorkerInfo
from orchestrator.spec.plan import Plan
from orchestrator.worker.checkpoint import CheckpointError, LayerFiles, read_layer_files
from orchestrator.worker.topology import RankSpec

# What a restore from a checkpoint hands the group: a reference for the ranks to read (a
# directory store), or the states themselves (the in-memory store: already in the controller).
CheckpointSource = LayerFiles | Mapping[int, Any]


def checkpoint_source(store: CheckpointStore, step: int) -> CheckpointSource:
    """The checkpoint at ``step`` as its ranks will read it: a :class:`LayerFiles` reference
    from a store that has files (``layer_files``: the manifest only is read here), else the
    store's states (``load``)."""
    resolve = getattr(store, "layer_files", None)
    if callable(resolve):
        ref = resolve(step)
        assert isinstance(ref, LayerFiles)
        return ref
    return store.load(step)


def launch_group(
    group: Any, plan: Plan, source: CheckpointSource | None, start_step: int
) -> list[WorkerInfo]:
    """Launch ``group`` (a fresh :class:`~orchestrator.runtime.group.WorkerGroup`) for
    ``plan``: with the states in hand as before, or, from a :class:`LayerFiles` reference,
    without states and then every rank reads its own layers (the group is stopped if that
    fails)."""
    if not isinstance(source, LayerFiles):
        workers: list[WorkerInfo] = group.launch(plan, source, start_step)
        return workers
    workers = group.launch(plan, None, start_step)
    try:
        with checkpoint_errors():
            read_by_holders(group, source, group.options.rendezvous_timeout_s)
    except BaseException:
        group.stop()
        raise
    return workers


def tp_stages(ranks: Sequence[RankSpec]) -> dict[int, RankSpec]:
    """The reader of each tensor-parallel stage (its first rank) -> its spec."""
    return {min(s.stage_ranks): s for s in ranks if s.tp > 1 and s.rank == min(s.stage_ranks)}


def read_once(actor: Any, source: LayerFiles, spec: RankSpec) -> tuple[Any, Any]:
    """``actor`` reads ``spec``'s layers of ``source`` once: (Ray reference of the whole states,
    reference of the bytes read). The states stay in the reader's node's object store until the
    stage's ranks take them; the controller holds only the references."""
    refs = actor.read_checkpoint_layers.options(num_returns=2).remote(
        source.for_layers(spec.layer_indices)
    )
    return refs[0], refs[1]


def read_by_holders(group: Any, source: LayerFiles, timeout_s: float) -> dict[int, int]:
    """Every rank of the launched ``group`` loads its layers of ``source``, each copy read
    and verified once by the rank that holds it (``ElasticWorker.load_checkpoint_layers``) or,
    for a tensor-parallel stage, by the stage's first rank for all its ranks. Returns reading
    rank -> bytes it read."""
    actors = group._actors
    reads = {
        spec.rank: actors[spec.rank].load_checkpoint_layers.remote(
            source.for_layers(spec.layer_indices)
        )
        for spec in group.ranks
        if spec.tp == 1
    }
    loads = {}
    for reader, spec in tp_stages(group.ranks).items():
        states, reads[reader] = read_once(actors[reader], source, spec)
        for r in spec.stage_ranks:  # each cuts its own part of the whole states
            loads[r] = actors[r].set_layer_states.remote(states)
    got = group._gather("read checkpoint layers", reads, timeout_s)
    group._gather("load checkpoint layers", loads, timeout_s)
    return {rank: int(n) for rank, n in got.items()}


def checkpoint_incoming(
    source: CheckpointSource,
    new_ranks: Sequence[RankSpec],
    incoming: list[list[Any]],
    actors: Sequence[Any],
) -> int:
    """Fill ``incoming`` (new rank -> what it is sent) for a re-formation from the checkpoint:
    a rank at tp 1 the reference naming its layers (it reads them), the ranks of a
    tensor-parallel stage the Ray object of the states their first rank reads once
    (``actors``: the new plan's actors by rank); for states in hand, one Ray object per layer
    (put once, shared by its holders). Returns how many layer copies are loaded."""
    if isinstance(source, LayerFiles):
        for spec in new_ranks:
            if spec.tp == 1:
                incoming[spec.rank] = [source.for_layers(spec.layer_indices)]
        for reader, spec in tp_stages(new_ranks).items():
            states, _bytes = read_once(actors[reader], source, spec)
            for r in spec.stage_ranks:
                incoming[r] = [states]
    else:
        import ray

        put = {layer: ray.put({layer: st}) for layer, st in source.items()}
        for spec in new_ranks:
            incoming[spec.rank] = [put[layer] for layer in spec.layer_indices]
    return sum(len(spec.layer_indices) for spec in new_ranks)


def resolve_incoming(incoming: Sequence[Any]) -> list[dict[int, Any]]:
    """In the actor: each item sent to it as ``{layer: state}``: Ray object references
    fetched, :class:`LayerFiles` references read and verified here."""
    import ray

    refs = [item for item in incoming if not isinstance(item, LayerFiles)]
    parts: list[dict[int, Any]] = list(ray.get(refs)) if refs else []
    parts += [read_layer_files(item) for item in incoming if isinstance(item, LayerFiles)]
    return parts


@contextlib.contextmanager
def checkpoint_errors() -> Iterator[None]:
    """A rank's failure to read a checkpoint file, raised as the ``CheckpointError`` it is
    (one line naming the rank and the file) instead of a generic worker failure."""
    try:
        yield
    except WorkerFailedError as exc:
        cause = _checkpoint_cause(exc.__cause__)
        if cause is not None:
            raise CheckpointError(f"rank {exc.rank} reading the checkpoint: {cause}") from None
        raise


def _checkpoint_cause(exc: BaseException | None) -> CheckpointError | None:
    """The ``CheckpointError`` behind a Ray task error (a rank's own, or the one its stage's
    reader raised, wrapped once more by the rank that waited for it)."""
    for _ in range(8):  # a few wrappings at most
        if exc is None or isinstance(exc, CheckpointError):
            return exc
        exc = getattr(exc, "cause", None) or exc.__cause__
    return None

"""The controller's :class:`~orchestrator.control.ports.WorkerGroupPort` on real Ray actors.

:class:`RayWorkerGroupPort` drives an :class:`~orchestrator.runtime.group.WorkerGroup` whose ranks
are :class:`~orchestrator.runtime.elastic.worker.ElasticWorker` actors (updates wait for the commit,
so survivors always answer with the last committed step). Plans pin stages by Ray node id, which
placement accepts as it is. A :class:`~orchestrator.control.ports.WorkerLost` from the group is
widened to every node that actually died: the node of a rank whose actor died, and any node of the
group that Ray reports dead (its other ranks are lost with it). Survivors that merely saw a broken
collective are not named.

A change of plan keeps the live actors (:attr:`RayWorkerGroupPort.keeps_survivors`): the port
asks the group to re-form in place (``ElasticWorkerGroup.reform`` in ``survivors.py``):
survivors keep their processes, parameters and optimizer state, their torch process groups are
destroyed and re-initialised for the new plan, and only layers that change owner move, actor to
actor. A restore of kind REPLICAS whose ``states`` are empty means "the state is in the workers,
at the last committed step". From a checkpoint, the survivors stay and every rank loads the
checkpoint's layers (a model mixing steps is not a model); from a checkpoint directory each rank
reads its own layers' files (``restore.py``), the controller resolving only the manifest.
Only the first launch, or one after the group was stopped, starts every actor fresh.

Checkpoints are written by the holders (:meth:`RayWorkerGroupPort.write_checkpoint`): each
layer's writer writes the layer's file into the store's staging directory itself, the other ranks
of a tensor-parallel stage or shard group send it their parts actor to actor; the controller only
commits the manifest. The checkpoint directory must be storage every worker sees.

Joins are warmed (:meth:`RayWorkerGroupPort.prepare`, :meth:`RayWorkerGroupPort.prepared`):
the controller asks for the candidate plan's new actors while the current plan trains and
switches once they are ready (``survivors.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from orchestrator.control.ports import CheckpointStore, WarmState, WarmStatus, WorkerLost
from orchestrator.control.recovery import LayerState, RestoreKind, RestoreSource
from orchestrator.runtime.actor import WorkerJob
from orchestrator.runtime.elastic.restore import (
    CheckpointSource,
    checkpoint_errors,
    checkpoint_source,
    launch_group,
)
from orchestrator.runtime.elastic.survivors import ElasticWorkerGroup, ReformReport
from orchestrator.runtime.group import GroupOptions, WorkerInfo, whole_states
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport
from orchestrator.worker.topology import copy_of, layer_copies, ranks_for_plan

log = logging.getLogger(__name__)

# Shorter than the fixed-plan defaults: after a failure, recovery time is the figure that counts.
ELASTIC_GROUP_OPTIONS = GroupOptions(failure_grace_s=20.0, stop_timeout_s=2.0)


class RayWorkerGroupPort:
    """One elastic worker group at a time, for the controller (see the module docstring)."""

    def __init__(
        self,
        job: WorkerJob,
        checkpoints: CheckpointStore,
        options: GroupOptions = ELASTIC_GROUP_OPTIONS,
    ) -> None:
        self.job = job
        self.checkpoints = checkpoints
        self.options = options
        self._group: ElasticWorkerGroup | None = None
        self._plan: Plan | None = None
        self._rank_node: dict[int, str] = {}  # rank -> Ray node id
        self._dead_ranks: set[int] = set()
        self._committed_steps = 0
        self.workers: list[WorkerInfo] = []
        self.last_reform: ReformReport | None = None  # what the last change of plan moved
        self._throttle_by_node: dict[str, float] = {}  # emulated extra slowdown (set_throttle)

    # The controller may leave the workers running across a change of plan, and hand launch() a
    # REPLICAS restore without states: the state stays in the workers (see the module docstring).
    keeps_survivors = True

    # -- the port ----------------------------------------------------------------------------

    def launch(self, plan: Plan, restore: RestoreSource) -> None:
        """Run ``plan`` from ``restore``: re-form the live group in place, or start fresh actors
        when there is none; the first step is ``restore.resume_step``."""
        if self._group is not None and self._group.workers:
            self._reform(self._group, plan, restore)
            return
        self.stop()
        if restore.kind is RestoreKind.REPLICAS and not restore.states:
            raise WorkerLost((), (), "the workers holding the state are gone")
        self.last_reform = None
        self._rank_node = _check_pins_alive(plan)
        states = self._states_for(restore)
        group = ElasticWorkerGroup(self.job, self.options)
        group.throttle_by_node = dict(self._throttle_by_node)
        self._group, self._plan = group, plan
        self._dead_ranks = set()
        try:
            self.workers = launch_group(group, plan, states, restore.resume_step)
        except WorkerLost as exc:
            raise self._lost(exc) from None
        self._rank_node = {w.rank: w.node_id for w in self.workers}
        self._committed_steps = restore.resume_step

    def _reform(self, group: ElasticWorkerGroup, plan: Plan, restore: RestoreSource) -> None:
        keep = restore.kind is RestoreKind.REPLICAS and not restore.states
        gone = _dead_node_ids()
        try:
            _check_pins_alive(plan)
            with checkpoint_errors():  # a rank that cannot read its checkpoint layers
                report = group.reform(
                    plan,
                    dead_ranks=self._dead_ranks
                    | {r for r, n in self._rank_node.items() if n in gone},
                    committed_steps=self._committed_steps,
                    start_step=restore.resume_step,
                    checkpoint_states=None if keep else self._states_for(restore),
                    keep_state=keep,
                )
        except WorkerLost as exc:
            lost = self._lost(exc)
            self.stop()  # a half re-formed group holds no consistent state
            raise lost from None
        except BaseException:
            self.stop()
            raise
        self._plan = plan
        self.workers = group.workers
        self._rank_node = {w.rank: w.node_id for w in self.workers}
        self._dead_ranks = set()
        self._committed_steps = restore.resume_step
        self.last_reform = report
        log.info("plan re-formed in place: %s", report.line())

    def step(self, step: int) -> StepReport:
        group = self._require_group()
        group.next_step = step
        try:
            report = group.step()
        except WorkerLost as exc:
            raise self._lost(exc) from None
        self._committed_steps = step + 1
        return report

    def layer_holders(self) -> Mapping[int, tuple[int, ...]]:
        """Layer -> the lowest rank of each copy of it whose ranks all live.

        A tensor-parallel stage or a shard group's sharded holders hold a layer only together
        (``topology.layer_copies``): one lost rank loses that copy for every rank in it, so the
        controller restores the layer from another copy, or from the checkpoint.
        """
        if self._plan is None:
            return {}
        return {
            layer: tuple(c[0] for c in copies if not set(c) & self._dead_ranks)
            for layer, copies in layer_copies(self._plan).items()
        }

    def placement(self) -> Mapping[int, str]:
        return dict(self._rank_node)

    def fetch_layer_states(self, sources: Mapping[int, int]) -> dict[int, LayerState]:
        """Each layer's whole state from the copy the given rank belongs to, as of the last
        committed step (the parts of a tensor-parallel stage or shard group joined)."""
        group = self._require_group()
        assert self._plan is not None
        chosen = {layer: copy_of(self._plan, layer, rank) for layer, rank in sources.items()}
        committed = self._committed_steps
        ranks = sorted({r for copy in chosen.values() for r in copy})
        refs = {r: group._actors[r].get_layer_states.remote(committed) for r in ranks}
        try:
            got = group._gather("fetch layer states", refs, self.options.step_timeout_s)
        except WorkerLost as exc:
            raise self._lost(exc) from None
        return dict(whole_states(got, chosen))

    def write_checkpoint(self, staging: str, sources: Mapping[int, int]) -> dict[str, object]:
        """Have each layer's copy (the one the given rank belongs to) write the layer's whole
        state, as of the last committed step, into ``staging`` (:func:`write_by_holders`).
        Returns file -> (sha256, bytes) from the writers; no layer passes through here."""
        group = self._require_group()
        assert self._plan is not None
        chosen = {layer: copy_of(self._plan, layer, rank) for layer, rank in sources.items()}
        try:
            return write_by_holders(
                group, staging, chosen, self._committed_steps, self.options.step_timeout_s
            )
        except WorkerLost as exc:
            raise self._lost(exc) from None

    def stop(self) -> None:
        group, self._group = self._group, None
        self._plan, self._rank_node = None, {}  # nothing holds layers any more
        if group is None:
            return
        try:
            group.stop()
        except Exception as exc:  # the actors or their nodes may be gone already
            log.warning("stopping the worker group: %s", exc)

    def prepare(self, plan: Plan) -> int:
        """Start and warm the workers ``plan`` needs that the running group lacks (joiners),
        while the current plan trains; how many are warming (0: the switch needs none)."""
        group = self._group
        if group is None or not group.workers:
            return 0
        try:
            return group.prepare(plan)
        except WorkerLost as exc:
            raise self._lost(exc) from None

    def prepared(self, plan: Plan) -> WarmStatus:
        """Whether the workers :meth:`prepare` started for ``plan`` are warm (never blocks)."""
        group = self._group
        if group is None:
            return WarmStatus(WarmState.FAILED, "the worker group is gone")
        try:
            return group.prepared(plan)
        except Exception as exc:  # the GCS busy, say: the switch goes ahead without them
            return WarmStatus(WarmState.FAILED, f"{type(exc).__name__}: {exc}")

    def abandon_on(self, node_id: str, posted_at_s: float) -> None:
        """A posted event reports ``node_id`` lost: a step in flight with a rank there is
        abandoned at once (never committed) and the controller recovers as from any loss."""
        group = self._group
        if group is not None:
            group.abandon_on(node_id, posted_at_s)

    def drain_on(self, node_id: str, deadline_s: float | None, posted_at_s: float) -> None:
        """A posted preemption notice for ``node_id``: a step in flight there that would end
        after the deadline is abandoned at once; otherwise it finishes (docs/controller.md)."""
        group = self._group
        if group is not None:
            group.drain_on(node_id, deadline_s, posted_at_s)

    def set_throttle(self, node_id: str, factor: float) -> list[int]:
        """Emulate a change of speed on a running node: its workers run ``factor`` times slower
        than its labelled speed (1.0: back to it), now and after any change of plan. Emulation
        only (workers on real GPUs ignore it). Returns the ranks on the node now."""
        from orchestrator.worker.emulation import Stretcher

        Stretcher(1.0).throttle(factor)  # a bad factor is refused before anything changes
        if factor == 1.0:
            self._throttle_by_node.pop(node_id, None)
        else:
            self._throttle_by_node[node_id] = factor
        group = self._group
        return group.set_throttle(node_id, factor) if group is not None else []

    # -- helpers -----------------------------------------------------------------------------

    @property
    def emulated(self) -> bool:
        return self._group is not None and self._group.emulated

    def _require_group(self) -> ElasticWorkerGroup:
        if self._group is None:
            raise RuntimeError("no worker group: launch() first")
        return self._group

    def _states_for(self, restore: RestoreSource) -> CheckpointSource | None:
        """What the ranks load: the states in hand, or a checkpoint they read themselves
        (a directory's files, as a reference: no layer is read here; ``restore.py``)."""
        if restore.kind is RestoreKind.REPLICAS:
            return dict(restore.states)
        if restore.kind is RestoreKind.CHECKPOINT:
            assert restore.checkpoint_step is not None
            return checkpoint_source(self.checkpoints, restore.checkpoint_step)
        return None

    def _lost(self, exc: WorkerLost) -> WorkerLost:
        """``exc`` widened to every node of the group that Ray reports dead, and its ranks."""
        ranks = set(exc.ranks)
        nodes = set(exc.nodes) | {self._rank_node[r] for r in ranks if r in self._rank_node}
        dead_nodes = _dead_node_ids() & set(self._rank_node.values())
        nodes |= dead_nodes
        ranks |= {r for r, n in self._rank_node.items() if n in dead_nodes}
        self._dead_ranks |= ranks
        return WorkerLost(ranks, nodes, exc.detail)


def write_by_holders(
    group: ElasticWorkerGroup,
    staging: str,
    chosen: Mapping[int, tuple[int, ...]],
    committed_steps: int,
    timeout_s: float,
) -> dict[str, object]:
    """Each layer's whole state after ``committed_steps`` steps, written into ``staging`` by the
    first rank of its ``chosen`` copy (layer -> ranks); the other ranks of a tensor-parallel
    stage or shard group send that writer their parts actor to actor. Returns file -> (sha256,
    bytes) as the writers report them. Raises :class:`WorkerLost` when a rank is lost."""
    actors = group._actors
    ranks = sorted({r for copy in chosen.values() for r in copy})
    by_writer: dict[int, dict[int, tuple[int, ...]]] = {}
    for layer, copy in sorted(chosen.items()):
        by_writer.setdefault(copy[0], {})[layer] = copy
    # Settled together first: a shard group's update ends in collectives among its holders, and
    # a writer's peers answer before the writer's own call runs (Ray resolves its arguments).
    settles = {r: actors[r].settle.remote(committed_steps) for r in ranks}
    group._gather("settle for the checkpoint", settles, timeout_s)
    refs = {}
    for writer, copies in by_writer.items():
        peers = sorted({r for c in copies.values() for r in c} - {writer})
        parts = [actors[r].get_layer_states.remote(committed_steps) for r in peers]
        refs[writer] = actors[writer].write_checkpoint.remote(
            staging, committed_steps, copies, peers, *parts
        )
    got = group._gather("write checkpoint", refs, timeout_s)
    return {name: report for files in got.values() for name, report in files.items()}


def _check_pins_alive(plan: Plan) -> dict[int, str]:
    """Rank -> pinned Ray node id; a pinned node that is not alive is a lost worker already."""
    import ray

    alive = {str(row["NodeID"]) for row in ray.nodes() if row.get("Alive", False)}
    pins = {s.rank: s.node for s in ranks_for_plan(plan) if s.node is not None}
    missing = {r: n for r, n in pins.items() if n not in alive}
    if missing:
        raise WorkerLost(missing, set(missing.values()), "planned node is gone")
    return pins


def _dead_node_ids() -> set[str]:
    """Node ids Ray lists as not alive (a crashed node stays listed, dead, for a while)."""
    import ray

    try:
        return {str(row["NodeID"]) for row in ray.nodes() if not row.get("Alive", False)}
    except Exception:  # the GCS may be briefly unreachable; the actors' deaths still count
        return set()

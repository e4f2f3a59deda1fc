"""The elastic worker group: one placement group per actor, and changes of plan that keep actors.

Placement: each rank's actor has a placement group of its own (one bundle). A lost node then
takes only its own actors' placement groups with it; the survivors' stay valid, and a new actor
needs one new one-bundle group, not a whole new gang.

:meth:`ElasticWorkerGroup.reform` moves the group to a new plan in place:

1. Survivors are the actors that answer and are not on a lost node; a survivor's step still in
   flight (blocked on a dead peer) is waited for briefly, and a survivor that stays stuck is
   dropped.
2. Each rank of the new plan gets a survivor on a node and device type the rank may use (its pin,
   or its type), the one already holding the most of the rank's layers; ranks left over get new
   actors, survivors left over are stopped.
3. Each layer a rank needs and its actor does not hold is *exported* by a survivor that holds it
   (``export_layers``) and handed to the new owner as a Ray object reference: the bytes go from
   actor to actor through Ray's object store, never through the driver. From a checkpoint, the
   driver reads the checkpoint and puts each layer once.
4. Every actor of the new plan destroys its process group and joins a new rendezvous (new store
   address, new world size, new rank map), keeping its layers in memory.

The figures of the last reform (bytes moved, layers kept, actors kept / warm / started) are in
:attr:`ElasticWorkerGroup.last_reform`.

Joins are warmed before the switch (:meth:`ElasticWorkerGroup.prepare`): for each rank of a
candidate plan that no running actor would take (a rank pinned to a new node), a one-bundle
placement group and an actor are created at once, without waiting, and the actor imports torch
and builds that rank's engine (``ElasticWorker.warm``) while the current plan keeps training.
:meth:`ElasticWorkerGroup.prepared` says, without blocking, whether they are ready; the
controller switches at the next step boundary after that, and :meth:`reform` adopts the warm
actors instead of starting new ones, so the switch pays only the rendezvous and the moved layers.
Warm actors that a reform does not use are stopped.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray

from orchestrator.control.ports import WarmStatus, WorkerLost
from orchestrator.runtime.discovery import discover_nodes
from orchestrator.runtime.elastic.moves import (
    LayerMoves,
    assign,
    broken_shard_holders,
    live_copies,
    route_layers,
)
from orchestrator.runtime.elastic.restore import CheckpointSource, checkpoint_incoming
from orchestrator.runtime.elastic.warm import WarmActor, WarmPool, remove_placed
from orchestrator.runtime.elastic.worker import ElasticWorkerActor
from orchestrator.runtime.group import WorkerGroup, WorkerInfo
from orchestrator.runtime.placement import (
    BundleRequest,
    PlacedGroup,
    bundle_requests,
    place_each,
    slots_for_plan,
)
from orchestrator.runtime.validation import validate_model_for_plan, validate_plan_for_cluster
from orchestrator.spec.labels import NODE_ID_LABEL
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport
from orchestrator.worker.topology import (
    RankSpec,
    ranks_for_plan,
    whole_layers,
)

# How long a survivor's step blocked on a dead peer may take to fail before the survivor is dropped.
INFLIGHT_GRACE_S = 10.0
# How long survivors' steps may stay in flight before the returned ones leave their process
# groups to unblock them (``_unblock``), and how long leaving may take. Short: the re-formation
# makes them leave next anyway, and the step in flight is never committed; a step blocked on a
# live peer that has left would otherwise cost this wait on every such recovery.
UNBLOCK_AFTER_S = 0.05
LEAVE_TIMEOUT_S = 2.0
# How often a step in flight looks for node events posted meanwhile (the bound on reacting).
POSTED_POLL_S = 0.02


@dataclass(frozen=True)
class ReformReport:
    """What one change of plan moved and kept, and where its time went."""

    bytes_moved: int  # layer state that changed owner (or came from the checkpoint)
    layers_moved: int
    layers_kept: int
    actors_kept: int
    actors_started: int  # started during the switch (placement, process, import, engine)
    duration_s: float
    actors_warm: int = 0  # started and warmed before the switch (``prepare``), adopted here
    # Seconds of the switch by part: finding the survivors, stopping the actors that are none,
    # placement and starting actors, exports, the slowest actor's engine build, layer load and
    # rendezvous.
    seconds: Mapping[str, float] | None = None

    def line(self) -> str:
        warm = f", {self.actors_warm} pre-warmed" if self.actors_warm else ""
        return (
            f"{self.actors_kept} actors kept{warm}, {self.actors_started} started; "
            f"{self.layers_kept} layers kept in place, {self.layers_moved} moved "
            f"({self.bytes_moved / 1e6:.2f} MB) in {self.duration_s:.2f} s"
        )


class ElasticWorkerGroup(WorkerGroup):
    """A worker group of elastic ranks that survives changes of plan (see the module docstring)."""

    actor_class = ElasticWorkerActor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pgs: list[PlacedGroup] = []
        self.last_reform: ReformReport | None = None
        # Emulated extra slowdown by Ray node id (set_throttle); actors built later get it too.
        self.throttle_by_node: dict[str, float] = {}
        # Nodes a posted event called lost (node id -> wall time it was posted): a step in
        # flight with a rank there is abandoned at once (see step()).
        self._posted_lost: dict[str, float] = {}
        self._posted_lock = threading.Lock()
        self.last_abandon: tuple[str, float] | None = None  # (node, event -> abandon seconds)
        self._formed_at_s = 0.0  # wall time the current plan's group was formed
        self._warm = WarmPool()  # joiners started ahead of a switch (prepare)
        # Posted preemption notices: node -> (deadline, wall time posted) (see drain_on).
        self._posted_drain: dict[str, tuple[float, float]] = {}
        self._last_step_s = 0.0  # the last step's duration: how long the next one should take
        self._step_ends_s = 0.0  # wall time the step in flight should end

    # -- launching ------------------------------------------------------------

    def _place_and_start(self, plan: Plan, requests: list[BundleRequest]) -> None:
        """One placement group per rank (a rank can then be replaced alone), one actor in each,
        one rendezvous."""
        self._pgs = place_each(requests, self.options.placement_timeout_s)
        plan_json = plan.model_dump_json()
        self._actors, self.workers = [], []
        for spec, placed in zip(self.ranks, self._pgs, strict=True):
            actor, info = self._spawn(spec, placed, plan_json)
            self._actors.append(actor)
            self.workers.append(info)
        self._join(plan_json, [False] * len(self._actors), [[] for _ in self._actors], 0)

    def stop(self) -> None:
        super().stop()  # the actors (the base's one placement group is never set here)
        pgs, self._pgs = self._pgs, []
        for placed in pgs:
            remove_placed(placed)
        self.drop_warm()

    # -- changing plan in place --------------------------------------------------------------

    def reform(
        self,
        plan: Plan,
        *,
        dead_ranks: set[int],
        committed_steps: int,
        start_step: int,
        checkpoint_states: CheckpointSource | None = None,
        keep_state: bool = True,
    ) -> ReformReport:
        """Move to ``plan`` keeping the surviving actors (see the module docstring).

        ``keep_state``: the survivors' layers are at ``committed_steps`` and are kept and moved;
        otherwise every layer comes from ``checkpoint_states`` (or the seed when None): a
        checkpoint's files each rank reads itself, or states in hand.
        """
        assert self.plan is not None, "reform() before launch()"
        started_s = time.perf_counter()
        num_planner_layers = validate_model_for_plan(self.job, plan)
        self._nodes = discover_nodes()
        validate_plan_for_cluster(plan, self._nodes, num_planner_layers)
        alive = self._survivors(dead_ranks)
        seconds = {"survivors_s": time.perf_counter() - started_s}
        if keep_state:
            alive -= self._settle(self.plan, alive, committed_steps)
        # What each survivor may keep in place: the layers it holds whole by itself.
        held = {r: whole_layers(self.plan, r) for r in alive}
        copies = _copies_left(self.plan, alive, dead_ranks, keep_state)
        new_ranks = ranks_for_plan(plan)
        requests = bundle_requests(slots_for_plan(plan), self._nodes)
        chosen = assign(new_ranks, requests, self._nodes, alive, self.workers, held)
        unused = self._drop_idle(alive, chosen, seconds)
        plan_json = plan.model_dump_json()
        members = self._members(new_ranks, requests, chosen, plan_json, seconds)
        exports_s = time.perf_counter()
        if keep_state:
            moves = route_layers(new_ranks, chosen, held, copies)
            incoming = self._export(new_ranks, moves, committed_steps)
        else:
            moves, incoming = _from_checkpoint(new_ranks, checkpoint_states, members.actors)
        seconds["exports_s"] = time.perf_counter() - exports_s
        for old in sorted(unused):
            self._drop(old)
        self._actors, self.workers, self._pgs = members.filled()
        self.plan, self.ranks = plan, new_ranks
        # Settled above, or (from the checkpoint) not needed: every pending update is dropped.
        join_s = time.perf_counter()
        keep = [keep_state] * len(new_ranks)
        infos = self._join(plan_json, keep, incoming, committed_steps if keep_state else 0)
        seconds["join_s"] = time.perf_counter() - join_s
        self.next_step = start_step
        self.last_reform = _report(infos, moves, len(chosen), members, started_s, seconds)
        return self.last_reform

    def _settle(self, old_plan: Plan, alive: set[int], committed_steps: int) -> set[int]:
        """Have the survivors settle the committed update; returns those whose state is unusable.

        A shard group's update ends in collectives among its sharded holders, so the survivors
        settle it together, before anything moves; a holder whose shard group lost a rank
        cannot, and its state is not used."""
        broken = broken_shard_holders(old_plan, alive)
        settle = {r: self._actors[r].settle.remote(committed_steps) for r in alive - broken}
        self._gather("settle the committed update", settle, self.options.step_timeout_s)
        return broken

    def _drop_idle(
        self, alive: set[int], chosen: Mapping[int, int], seconds: dict[str, float]
    ) -> set[int]:
        """Stop the actors the new plan does not use that are no survivors; returns the
        survivors it does not use (stopped after the exports, as they may send layers)."""
        unused = set(range(len(self._actors))) - set(chosen.values())
        # Actors that are no survivors (stuck on a dead peer, say) hold no state to export but
        # still hold their node's slot: stop them first, or a new actor for that node waits for
        # a slot that frees only after it was placed.
        drop_s = time.perf_counter()
        for old in sorted(unused - alive):
            self._drop(old)
        seconds["drop_s"] = time.perf_counter() - drop_s
        return unused & alive

    def _members(
        self,
        new_ranks: Sequence[RankSpec],
        requests: Sequence[BundleRequest],
        chosen: Mapping[int, int],
        plan_json: str,
        seconds: dict[str, float],
    ) -> _Members:
        """The new plan's actor per rank: the survivor ``chosen`` for it, else a warm joiner
        started ahead (``prepare``), else a new actor placed and started now."""
        missing = [spec.rank for spec in new_ranks if spec.rank not in chosen]
        n = len(new_ranks)
        out = _Members([None] * n, [None] * n, [None] * n)
        # Ranks a warm joiner was started for take it; only the others start actors now.
        warm = self._claim_warm(missing, requests)
        for new, w in warm.items():
            out.actors[new], out.pgs[new] = w.actor, w.placed
            out.workers[new] = replace(w.info, rank=new, device_type=new_ranks[new].device_type)
        self.drop_warm()  # joiners this plan does not use
        missing = [r for r in missing if r not in warm]
        placed_s = time.perf_counter()
        fresh_pgs = place_each([requests[r] for r in missing], self.options.placement_timeout_s)
        for new, old in chosen.items():
            out.actors[new], out.pgs[new] = self._actors[old], self._pgs[old]
            kept = self.workers[old]
            out.workers[new] = replace(kept, rank=new, device_type=new_ranks[new].device_type)
        for new, placed in zip(missing, fresh_pgs, strict=True):
            out.actors[new], out.workers[new] = self._spawn(new_ranks[new], placed, plan_json)
            out.pgs[new] = placed
        seconds["place_and_start_s"] = time.perf_counter() - placed_s
        out.warm, out.started = len(warm), len(missing)
        return out

    def _export(
        self, new_ranks: Sequence[RankSpec], moves: LayerMoves, committed_steps: int
    ) -> list[list[Any]]:
        """Have each survivor export the layers ``moves`` routes from it; per new rank, the
        references it receives. Every export is done before any holder re-forms (a holder may
        be a receiver too)."""
        incoming: list[list[Any]] = [[] for _ in new_ranks]
        exports: list[Any] = []
        for spec in new_ranks:
            for source, layers in sorted(moves.sources[spec.rank].items()):
                ref = self._actors[source].export_layers.remote(committed_steps, layers)
                exports.append(ref)
                incoming[spec.rank].append(ref)
        if exports:
            self._gather("export layers", dict(enumerate(exports)), self.options.step_timeout_s)
        return incoming

    # -- joiners warmed ahead of a switch ----------------------------------------------------

    def prepare(self, plan: Plan) -> int:
        """Start and warm the actors ``plan`` would need that no running actor would take
        (ranks pinned to nodes without one); returns how many are warming for it. Does not
        wait: :meth:`prepared` says when they are ready."""
        assert self.plan is not None, "prepare() before launch()"
        validate_model_for_plan(self.job, plan)
        self._nodes = discover_nodes()
        new_ranks = ranks_for_plan(plan)
        requests = bundle_requests(slots_for_plan(plan), self._nodes)
        alive = set(range(len(self._actors)))
        held = {r: whole_layers(self.plan, r) for r in alive}
        chosen = assign(new_ranks, requests, self._nodes, alive, self.workers, held)
        plan_json = plan.model_dump_json()
        earlier, self._warm = self._warm, WarmPool()
        for spec in new_ranks:
            request = requests[spec.rank]
            pin = request.label_selector.get(NODE_ID_LABEL)
            if spec.rank in chosen or pin is None:
                continue
            w = earlier.take(pin, request.uses_gpus)
            if w is None:
                w = self._start_warm(spec, request, pin, plan_json)
            else:
                w.rewarm(plan_json, spec.rank)
            self._warm.actors.append(w)
        earlier.stop_all()  # warm for an earlier candidate, on a node this one does not use
        return len(self._warm.warming_for(plan_json))

    def prepared(self, plan: Plan) -> WarmStatus:
        """Whether every actor :meth:`prepare` started for ``plan`` is warm (never blocks)."""
        return self._warm.status(plan.model_dump_json())

    def drop_warm(self) -> None:
        """Stop the warm actors no plan has taken."""
        self._warm.stop_all()

    def _start_warm(
        self, spec: RankSpec, request: BundleRequest, node_id: str, plan_json: str
    ) -> WarmActor:
        from ray.util.placement_group import placement_group

        asked_unix_s = time.time()
        pg = placement_group(
            [dict(request.resources)],
            strategy="PACK",
            bundle_label_selector=[dict(request.label_selector)],
        )
        placed = PlacedGroup(pg, (node_id,), (request,))
        actor, info = self._spawn(spec, placed, plan_json)  # scheduled once the group is ready
        ref = actor.warm.remote(plan_json, spec.rank)
        return WarmActor(
            actor, placed, info, request.uses_gpus, (plan_json, spec.rank), ref, asked_unix_s
        )

    def _claim_warm(
        self, missing: Sequence[int], requests: Sequence[BundleRequest]
    ) -> dict[int, WarmActor]:
        """New rank -> the warm actor it takes: one on its pinned node (a warm actor of an
        earlier candidate builds this rank's engine during the rendezvous instead)."""
        out: dict[int, WarmActor] = {}
        for rank in missing:
            request = requests[rank]
            w = self._warm.take(request.label_selector.get(NODE_ID_LABEL), request.uses_gpus)
            if w is not None:
                out[rank] = w
        return out

    def abandon_on(self, node_id: str, posted_at_s: float) -> None:
        """A posted event says ``node_id`` is lost: the step in flight (and any later one) with
        a rank there is abandoned within a poll period (thread-safe; called beside the
        controller's thread)."""
        with self._posted_lock:
            self._posted_lost[node_id] = posted_at_s

    def drain_on(self, node_id: str, deadline_s: float | None, posted_at_s: float) -> None:
        """A posted preemption notice for ``node_id`` with a wall-clock deadline: a step in
        flight there that would end after the deadline is abandoned at once (the node would
        vanish under it); one that ends before is finished and the controller evacuates at its
        boundary (thread-safe)."""
        if deadline_s is None:
            return
        with self._posted_lock:
            self._posted_drain[node_id] = (deadline_s, posted_at_s)

    def step(self) -> StepReport:
        """Run step ``next_step`` on every rank; abandon it (``WorkerLost``, never committed)
        as soon as a posted event names a node of one of its ranks lost, or posts a preemption
        deadline there that falls before the step would end (the last step's duration)."""
        assert self.plan is not None, "step() before launch()"
        step = self.next_step
        self._step_ends_s = time.time() + self._last_step_s
        self._check_posted(f"step {step}")
        started = time.perf_counter()
        refs = {r: a.train_step.remote(step) for r, a in enumerate(self._actors)}
        self._inflight = dict(refs)
        pending = {ref: r for r, ref in refs.items()}
        deadline = time.monotonic() + self.options.step_timeout_s
        failed = False
        while pending and not failed and time.monotonic() < deadline:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POSTED_POLL_S)
            for ref in ready:
                pending.pop(ref)
                try:
                    ray.get(ref, timeout=0)
                except Exception:  # a failed rank: judged at once below, as the base group does
                    failed = True
            if pending and not failed:
                self._check_posted(f"step {step}")
        # Gather as the base group does (failures judged there, timeout included).
        results = self._gather(f"step {step}", refs, max(0.0, deadline - time.monotonic()))
        self._inflight = {}
        self.next_step = step + 1
        self._last_step_s = time.perf_counter() - started
        return self._report(step, results, self._last_step_s)

    def _check_posted(self, phase: str) -> None:
        self._check_drains(phase)
        with self._posted_lock:
            posted = dict(self._posted_lost)
        if not posted:
            return
        # A loss posted before this plan was formed was seen by the controller already: a plan
        # formed after it that still uses the node means the node was cleared since.
        posted = {n: t for n, t in posted.items() if t >= self._formed_at_s}
        nodes = {w.node_id for w in self.workers} & set(posted)
        if not nodes:
            return
        ranks = tuple(w.rank for w in self.workers if w.node_id in nodes)
        node = sorted(nodes)[0]
        after_s = time.time() - posted[node]
        self.last_abandon = (node, after_s)
        with self._posted_lock:
            for n in nodes:
                self._posted_lost.pop(n, None)
        raise WorkerLost(
            ranks, nodes, f"{phase} abandoned {after_s:.3f} s after a node event reported it lost"
        )

    def _check_drains(self, phase: str) -> None:
        with self._posted_lock:
            drains = {
                n: deadline
                for n, (deadline, posted_s) in self._posted_drain.items()
                if posted_s >= self._formed_at_s  # an older notice was evacuated already
            }
        late = deadline_hits(drains, {w.node_id for w in self.workers}, self._step_ends_s)
        if not late:
            return
        ranks = tuple(w.rank for w in self.workers if w.node_id in late)
        with self._posted_lock:
            for n in late:
                self._posted_drain.pop(n, None)
        raise WorkerLost(
            ranks,
            late,
            f"{phase} abandoned: the preemption deadline of {sorted(late)} falls before the "
            "step would end",
        )

    def set_throttle(self, node_id: str, factor: float, timeout_s: float = 10.0) -> list[int]:
        """Make the actors on ``node_id`` run ``factor`` times slower than its labelled speed
        (emulation only; 1.0 undoes it); actors placed there later start so. The ranks told."""
        if factor == 1.0:
            self.throttle_by_node.pop(node_id, None)
        else:
            self.throttle_by_node[node_id] = factor
        pairs = list(zip(self._actors, self.workers, strict=False))  # a copy: reform may swap
        refs = {w.rank: a.set_throttle.remote(factor) for a, w in pairs if w.node_id == node_id}
        # Not _gather: this runs beside the controller's thread and must not judge failures.
        ray.get(list(refs.values()), timeout=timeout_s)
        return sorted(refs)

    # -- helpers -----------------------------------------------------------------------------

    def _survivors(self, dead_ranks: set[int]) -> set[int]:
        """Old ranks whose actor lives and whose last step has returned (failed or not)."""
        # Ranks known dead are not asked again: their pings would wait for Ray's verdict.
        alive = self._alive_ranks(set(range(len(self._actors))) - set(dead_ranks))
        pending = {ref: r for r, ref in self._inflight.items() if r in alive}
        if pending:
            _ready, stuck = ray.wait(
                list(pending), num_returns=len(pending), timeout=UNBLOCK_AFTER_S
            )
            if stuck:
                self._unblock(alive - {pending[ref] for ref in stuck})
                _ready, stuck = ray.wait(stuck, num_returns=len(stuck), timeout=INFLIGHT_GRACE_S)
            alive -= {pending[ref] for ref in stuck}
        self._inflight = {}
        return alive

    def _unblock(self, returned: set[int]) -> None:
        """Free survivors still in their step: they wait in a collective on a peer that is alive
        but has left it (its own step failed on the dead rank, so it sends nothing more), and
        gloo would wait out its whole timeout. The survivors whose step has returned leave their
        process groups now (the re-formation would next): their sockets close, and a collective
        waiting on them fails at once with a closed connection."""
        refs = [self._actors[r].leave_group.remote() for r in sorted(returned)]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=LEAVE_TIMEOUT_S)

    def _drop(self, old: int) -> None:
        actor = self._actors[old]
        with contextlib.suppress(Exception):  # already dead
            ray.kill(actor, no_restart=True)
        remove_placed(self._pgs[old])

    def _spawn(self, spec: RankSpec, placed: PlacedGroup, plan_json: str) -> tuple[Any, WorkerInfo]:
        """Start ``spec``'s actor in its own one-bundle placement group ``placed``."""
        node_id, request = placed.bundle_node_ids[0], placed.requests[0]
        return self._start_actor(spec, node_id, request, placed.placement_group, 0, plan_json)

    def _join(
        self,
        plan_json: str,
        keep: Sequence[bool],
        incoming: Sequence[list[Any]],
        committed_steps: int,
    ) -> dict[int, dict[str, Any]]:
        """Every actor (re)builds its engine for its rank and joins a new rendezvous."""
        self._formed_at_s = time.time()
        throttle = [self.throttle_by_node.get(w.node_id, 1.0) for w in self.workers]
        return self._rendezvous(
            lambda r, actor, world: actor.reform.remote(
                plan_json, r, world, committed_steps, keep[r], incoming[r], throttle[r]
            )
        )


def deadline_hits(deadlines: Mapping[str, float], nodes: set[str], step_ends_s: float) -> set[str]:
    """Nodes of the step whose posted preemption deadline falls before the step should end:
    the step cannot finish on them, so it is abandoned at once rather than finished."""
    return {n for n, deadline in deadlines.items() if n in nodes and deadline <= step_ends_s}


@dataclass
class _Members:
    """The new plan's actors, workers and placement groups by rank, and how many were warm or
    started (``None`` only while :meth:`ElasticWorkerGroup._members` fills them)."""

    actors: list[Any]
    workers: list[WorkerInfo | None]
    pgs: list[PlacedGroup | None]
    warm: int = 0
    started: int = 0

    def filled(self) -> tuple[list[Any], list[WorkerInfo], list[PlacedGroup]]:
        """The actors, workers and placement groups, every rank's filled."""
        workers = [w for w in self.workers if w is not None]
        return self.actors, workers, [p for p in self.pgs if p is not None]


def _copies_left(
    old_plan: Plan, alive: set[int], dead_ranks: set[int], keep_state: bool
) -> dict[int, list[tuple[int, ...]]]:
    """The live copies of each layer; with ``keep_state``, ``WorkerLost`` where a layer has
    none (checked before anything is placed or moved)."""
    copies = live_copies(old_plan, alive)
    lost = sorted(layer for layer, options in copies.items() if not options)
    if keep_state and lost:
        raise WorkerLost(tuple(sorted(dead_ranks)), (), f"planner layers {lost} have no live copy")
    return copies


def _from_checkpoint(
    new_ranks: Sequence[RankSpec], source: CheckpointSource | None, actors: Sequence[Any]
) -> tuple[LayerMoves, list[list[Any]]]:
    """Every layer from the checkpoint (none: the seed); per new rank, what it receives: the
    ranks read a checkpoint's files themselves (``restore.checkpoint_incoming``); ``actors``:
    the new plan's actors by rank."""
    moves = LayerMoves([{} for _ in new_ranks])
    incoming: list[list[Any]] = [[] for _ in new_ranks]
    if source:
        moves.moved += checkpoint_incoming(source, new_ranks, incoming, actors)
    return moves, incoming


def _report(
    infos: Mapping[int, Mapping[str, Any]],
    moves: LayerMoves,
    actors_kept: int,
    members: _Members,
    started_s: float,
    seconds: dict[str, float],
) -> ReformReport:
    """The reform's figures, with the slowest actor's engine build, layer load and rendezvous."""
    slowest = {
        part: max(float(i.get(part, 0.0)) for i in infos.values())
        for part in ("build_s", "load_s", "rendezvous_s")
    }
    return ReformReport(
        bytes_moved=sum(int(i["bytes_in"]) for i in infos.values()),
        layers_moved=moves.moved,
        layers_kept=moves.kept,
        actors_kept=actors_kept,
        actors_started=members.started,
        duration_s=time.perf_counter() - started_s,
        actors_warm=members.warm,
        seconds={**seconds, **slowest},
    )

"""The worker group: the actors of one plan, launched, stepped and stopped together.

The port the elastic controller drives (a small surface, so it can be faked in tests)::

    group.launch(plan, layer_states=None, start_step=0)   # place, start, rendezvous, load state
    group.step() -> StepReport                            # one training step on every rank
    group.fetch_layer_states() -> {layer: state}          # from the live holders of each layer
    group.stop()                                          # tear down; safe to call twice

Any worker that dies surfaces as :class:`~orchestrator.control.ports.WorkerLost` naming the
ranks lost and the Ray node ids they ran on; a worker that raises while all stay alive as
``WorkerFailedError``; a phase that does not finish in time as ``WorkerTimeoutError``. User
mistakes raised inside a worker (a :class:`~orchestrator.errors.UserError`) come back as
themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.control.ports import WorkerLost
from orchestrator.errors import NonFiniteStepError, UserError
from orchestrator.runtime.actor import WorkerActor, WorkerJob
from orchestrator.runtime.discovery import (
    RayNode,
    discover_nodes,
    emulated_reference_speed,
    slowdown_factor,
)
from orchestrator.runtime.errors import WorkerFailedError, WorkerTimeoutError
from orchestrator.runtime.liveness import alive_ranks
from orchestrator.runtime.placement import (
    BundleRequest,
    PlacedGroup,
    bundle_requests,
    place,
    slots_for_plan,
)
from orchestrator.runtime.validation import validate_model_for_plan, validate_plan_for_cluster
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import MemoryUse, StageTiming, StepReport
from orchestrator.worker.topology import RankSpec, layer_copies, ranks_for_plan


@dataclass(frozen=True)
class GroupOptions:
    """Timeouts of the group's phases, in seconds."""

    placement_timeout_s: float = 120.0
    rendezvous_timeout_s: float = 120.0
    step_timeout_s: float = 600.0
    # After a failure: how long to wait for the other workers' liveness answers, so one failure
    # names every lost rank (a crashed node's actors are declared dead after Ray's health checks,
    # ~15 s by default).
    failure_grace_s: float = 20.0
    stop_timeout_s: float = 10.0


@dataclass(frozen=True)
class WorkerInfo:
    """Where one rank runs and whether its speed is emulated."""

    rank: int
    node_id: str
    node_name: str
    device_type: str
    slowdown_factor: float
    emulated: bool


class WorkerGroup:
    """One actor per rank of a plan; see the module docstring for the port it offers."""

    # The Ray actor class each rank runs (the elastic runtime swaps in a subclass).
    actor_class: Any = WorkerActor

    def __init__(self, job: WorkerJob, options: GroupOptions | None = None) -> None:
        self.job = job
        self.options = options or GroupOptions()
        self.plan: Plan | None = None
        self.ranks: list[RankSpec] = []
        self.workers: list[WorkerInfo] = []
        self.next_step = 0
        self._actors: list[Any] = []
        self._placed: PlacedGroup | None = None
        self._nodes: list[RayNode] = []
        self._inflight: dict[int, Any] = {}  # rank -> its current (or last failed) step's ref

    # ---- the port ---------------------------------------------------------------------------

    def launch(
        self,
        plan: Plan,
        layer_states: Mapping[int, Mapping[str, Any]] | None = None,
        start_step: int = 0,
    ) -> list[WorkerInfo]:
        """Place and start the workers of ``plan``, join them, and load ``layer_states``.

        Before any actor starts, the model factory is imported and checked against the plan, and
        the plan against the live cluster: mistakes raise a one-line ``SpecError``.
        """
        if self._actors:
            raise RuntimeError("launch() on a running group; stop() it first")
        num_planner_layers = validate_model_for_plan(self.job, plan)
        self._nodes = discover_nodes()
        validate_plan_for_cluster(plan, self._nodes, num_planner_layers)
        self.plan, self.ranks = plan, ranks_for_plan(plan)
        requests = bundle_requests(slots_for_plan(plan), self._nodes)
        try:
            self._place_and_start(plan, requests)
            if layer_states:
                self.set_layer_states(layer_states)
        except BaseException:
            self.stop()
            raise
        self.next_step = start_step
        return self.workers

    def step(self) -> StepReport:
        """Run step ``next_step`` on every rank and gather one report."""
        assert self.plan is not None, "step() before launch()"
        step = self.next_step
        started = time.perf_counter()
        refs = {r: a.train_step.remote(step) for r, a in enumerate(self._actors)}
        # Kept when the step fails: a group re-formed in place waits for its survivors' calls.
        self._inflight = dict(refs)
        results = self._gather(f"step {step}", refs, self.options.step_timeout_s)
        self._inflight = {}
        duration_s = time.perf_counter() - started
        self.next_step = step + 1
        return self._report(step, results, duration_s)

    def fetch_layer_states(self) -> dict[int, dict[str, Any]]:
        """Each planner layer's whole parameters and optimizer state, from a live copy of it.

        A copy is the ranks that together hold the layer (``topology.layer_copies``): one rank,
        a tensor-parallel stage, or a shard group's sharded holders; their parts are joined
        here into the tp-1, unsharded form. Raises :class:`WorkerLost` naming the ranks when some
        layer has no copy whose ranks all live.
        """
        assert self.plan is not None, "fetch_layer_states() before launch()"
        alive = self._alive_ranks()
        chosen: dict[int, tuple[int, ...]] = {}
        for layer, copies in sorted(layer_copies(self.plan).items()):
            live = [c for c in copies if set(c) <= alive]
            if not live:
                dead = tuple(r for r in range(len(self._actors)) if r not in alive)
                raise WorkerLost(dead, self._node_ids(dead), f"layer {layer} has no live copy")
            chosen[layer] = live[0]
        ranks = sorted({r for copy in chosen.values() for r in copy})
        refs = {r: self._actors[r].get_layer_states.remote() for r in ranks}
        got = self._gather("fetch layer states", refs, self.options.step_timeout_s)
        return whole_states(got, chosen)

    def stop(self) -> None:
        """Shut every worker down (briefly politely, then by force) and free the placement."""
        actors, self._actors = self._actors, []
        if actors:
            refs = [a.shutdown.remote() for a in actors]
            ray.wait(refs, num_returns=len(refs), timeout=self.options.stop_timeout_s)
            for a in actors:
                ray.kill(a, no_restart=True)
        if self._placed is not None:
            self._placed.remove()
            self._placed = None

    # ---- helpers ----------------------------------------------------------------------------

    @property
    def emulated(self) -> bool:
        """Whether any worker stretches its compute to an emulated speed."""
        return any(w.emulated for w in self.workers)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def set_layer_states(self, states: Mapping[int, Mapping[str, Any]]) -> None:
        """Give each rank the states of its own layers (every layer of the plan must be there)."""
        missing = sorted(set(range(self.plan.num_layers if self.plan else 0)) - set(states))
        if missing:
            raise UserError(
                f"layer states lack planner layers {missing}",
                field="layer_states",
                fix="resume from a checkpoint of this model",
            )
        refs = {
            spec.rank: self._actors[spec.rank].set_layer_states.remote(
                {i: states[i] for i in spec.layer_indices}
            )
            for spec in self.ranks
        }
        self._gather("set layer states", refs, self.options.rendezvous_timeout_s)

    def _place_and_start(self, plan: Plan, requests: list[BundleRequest]) -> None:
        """Reserve the plan's bundles (one placement group), start one actor per rank in them
        and join the actors in one rendezvous."""
        self._placed = place(requests, self.options.placement_timeout_s, name="")
        plan_json = plan.model_dump_json()
        self.workers = []
        for spec, node_id, request in zip(
            self.ranks, self._placed.bundle_node_ids, self._placed.requests, strict=True
        ):
            actor, info = self._start_actor(
                spec, node_id, request, self._placed.placement_group, spec.rank, plan_json
            )
            self._actors.append(actor)
            self.workers.append(info)
        self._rendezvous(lambda rank, actor, world: actor.setup.remote(*world))

    def _start_actor(
        self,
        spec: RankSpec,
        node_id: str,
        request: BundleRequest,
        placement_group: Any,
        bundle_index: int,
        plan_json: str,
    ) -> tuple[Any, WorkerInfo]:
        """Start ``spec``'s actor in its bundle (its node's emulated speed, if any, relative to
        the fastest node's); the actor and what is known of it before it reports."""
        node = {n.node_id: n for n in self._nodes}.get(node_id)
        reference = emulated_reference_speed(self._nodes)
        factor = slowdown_factor(node, reference) if node is not None else 1.0
        emulated = node is not None and node.emulated
        strategy = PlacementGroupSchedulingStrategy(
            placement_group, placement_group_bundle_index=bundle_index
        )
        actor = self.actor_class.options(
            num_cpus=0 if request.uses_gpus else 1,
            num_gpus=1 if request.uses_gpus else 0,
            scheduling_strategy=strategy,
        ).remote(self.job, plan_json, spec.rank, factor if emulated else None)
        name = node.name if node is not None else node_id[:12]
        return actor, WorkerInfo(spec.rank, node_id, name, spec.device_type, factor, emulated)

    def _rendezvous(
        self, join: Callable[[int, Any, tuple[str, int, int, float]], Any]
    ) -> dict[int, dict[str, Any]]:
        """Every actor joins one new rendezvous: ``join(rank, actor, (address, port, world size,
        timeout))`` is its call. Their answers, by rank; the workers' facts updated from them."""
        timeout_s = self.options.rendezvous_timeout_s
        where = self._gather("start", {0: self._actors[0].where.remote()}, timeout_s)[0]
        world = (where["address"], where["port"], len(self._actors), timeout_s)
        refs = {r: join(r, a, world) for r, a in enumerate(self._actors)}
        infos = self._gather("rendezvous", refs, timeout_s + 30.0)
        # The actor has the last word on emulation (it turns it off where it finds a real GPU).
        self.workers = [
            replace(
                w,
                slowdown_factor=float(infos[w.rank]["slowdown_factor"]),
                emulated=bool(infos[w.rank]["emulated"]),
            )
            for w in self.workers
        ]
        return infos

    def _report(
        self, step: int, results: dict[int, dict[str, Any]], duration_s: float
    ) -> StepReport:
        assert self.plan is not None
        losses = [float(r["loss"]) for r in results.values() if r.get("loss") is not None]
        evals = [r for r in results.values() if r.get("eval_loss") is not None]
        timings = tuple(
            StageTiming(
                replica=spec.replica,
                stage=spec.stage,
                device_type=spec.device_type,
                compute_s=float(results[spec.rank].get("compute_s", 0.0)),
                step_s=float(results[spec.rank].get("step_s", 0.0)),
                memory=_memory_use(results[spec.rank].get("memory")),
                collective_s=float(results[spec.rank].get("collective_s", 0.0)),
            )
            for spec in self.ranks
        )
        return StepReport(
            step=step,
            # Each last stage reports its replica's weighted share: their sum is the batch loss.
            loss=sum(losses),
            step_duration_s=duration_s,
            samples=self.plan.global_batch_size,
            stage_timings=timings,
            # Every rank decides overflow alike (an all-reduced flag); any one says so.
            overflow_skipped=any(bool(r.get("overflow_skipped")) for r in results.values()),
            loss_scale=max(float(r.get("loss_scale", 1.0)) for r in results.values()),
            # Validation shares add up like the loss's (worker/evaluate.py).
            eval_loss=sum(float(r["eval_loss"]) for r in evals) if evals else None,
            eval_after_steps=int(evals[0]["eval_after_steps"]) if evals else None,
        )

    def _gather(self, phase: str, refs: Mapping[int, Any], timeout_s: float) -> dict[int, Any]:
        pending = {ref: rank for rank, ref in refs.items()}
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            remaining = max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
            if not ready:
                self._raise_lost(phase, detail="")  # a dead peer often explains a hang
                raise WorkerTimeoutError(phase, tuple(sorted(pending.values())), timeout_s)
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except (RayActorError, RayTaskError, GetTimeoutError) as exc:
                    self._raise_failure(phase, rank, exc)
        return results

    def _raise_failure(self, phase: str, rank: int, exc: BaseException) -> None:
        detail = f"rank {rank}: {type(exc).__name__}"
        self._raise_lost(phase, detail, also=(rank,) if isinstance(exc, RayActorError) else ())
        cause = getattr(exc, "cause", None) or exc
        if isinstance(cause, UserError | NonFiniteStepError):  # the same on every rank
            raise cause from None
        text = f"{type(cause).__name__}: {cause}"
        remote = getattr(exc, "traceback_str", "")  # the worker's traceback, for the user
        if isinstance(remote, str) and remote.strip():
            text = f"{text}\n{remote.rstrip()}"
        raise WorkerFailedError(phase, rank, text) from exc

    def _raise_lost(self, phase: str, detail: str, also: tuple[int, ...] = ()) -> None:
        dead = tuple(sorted((set(range(len(self._actors))) - self._alive_ranks()) | set(also)))
        if dead:
            raise WorkerLost(dead, self._node_ids(dead), f"{phase}; {detail}".strip("; "))

    def _alive_ranks(self, among: set[int] | None = None) -> set[int]:
        """Ranks (of ``among``, default all) whose actor answers a ping (a second thread answers
        even during a step); a crashed node's actors are told dead at once by its unreachable
        raylet rather than after Ray's health checks (``runtime/liveness.py``). One that stays
        silent on a reachable node counts as alive: its process is stuck, and the step timeout
        names it."""
        nodes = {w.rank: w.node_id for w in self.workers}
        ranks = set(range(len(self._actors))) if among is None else among
        return alive_ranks(self._actors, nodes, ranks, self.options.failure_grace_s)

    def _node_ids(self, ranks: tuple[int, ...]) -> tuple[str, ...]:
        ids = {w.rank: w.node_id for w in self.workers}
        return tuple(ids[r] for r in ranks if r in ids)


def _memory_use(raw: Any) -> MemoryUse | None:
    """A rank's counted memory from its step result (a dict once it has crossed Ray)."""
    if raw is None or isinstance(raw, MemoryUse):
        return raw
    return MemoryUse(**raw)


def whole_states(
    parts_by_rank: Mapping[int, Mapping[int, Any]], copies: Mapping[int, tuple[int, ...]]
) -> dict[int, dict[str, Any]]:
    """Layer -> whole state, from each rank's ``get_layer_states`` answer and the copy chosen
    for each layer (the parts of a tensor-parallel stage or a shard group are joined)."""
    from orchestrator.worker.sharding import merge_sharded_states  # torch: in the caller only

    parts: dict[int, list[Any]] = {}
    for layer, copy in copies.items():
        parts[layer] = [parts_by_rank[r][layer] for r in copy]
    # A shard group's slices are cut from its layers' joint flat state: merge them together.
    for copy in copies.values():
        for other in sorted({i for r in copy for i in parts_by_rank[r]} - set(parts)):
            parts[other] = [parts_by_rank[q][other] for q in copy if other in parts_by_rank[q]]
    merged = merge_sharded_states(parts)
    return {layer: merged[layer] for layer in copies}

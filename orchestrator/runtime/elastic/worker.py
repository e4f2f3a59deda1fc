"""The elastic worker: a :class:`~orchestrator.runtime.actor.WorkerActor` whose optimizer update
waits for the step to commit.

Why: after a failure the survivors must hold the state of the last *committed* step (every rank
finished it). A rank that already applied step ``k``'s update while a peer died during step ``k``
would be one step ahead of the others, and its layers could not be mixed with theirs.

How (the cheaper of the two correct ways): a step runs forward, backward and the gradient
all-reduce, then *stops* with the reduced gradients in hand (``pending``). The driver declares
step ``k`` committed when every rank returned it; the update is applied at the start of step
``k + 1`` or when the driver reads the states with ``committed_steps = k + 1``. A read with
``committed_steps = k`` (step ``k`` did not complete everywhere) drops the pending gradients
instead. Nothing is copied per step, and no extra round trip is added: the alternative, a copy of
every layer's parameters and optimizer state at each commit, costs three model-sized copies per
step. The update's compute (and its emulated stretch) is counted in the next step's timings.

A second thread answers :meth:`ping` and :meth:`get_layer_states` while a step is blocked in a
collective on a dead peer; reading is safe then: a blocked step changes gradients only.

A change of plan keeps the actor (:meth:`reform`): the committed update is settled, the process
group is destroyed, a new engine is built for the new rank and joins a new rendezvous; the layers
this actor keeps are handed to it as the same modules and optimizers (no copy), and the layers it
gains arrive as Ray object references exported by the peers that held them
(:meth:`export_layers`), so their bytes go actor to actor, never through the driver. From a
checkpoint's directory, the actor reads its own layers' files (``restore.py``; verified against
the manifest's sha256): :meth:`load_checkpoint_layers` after a fresh set-up, or in :meth:`reform`.

A joiner is warmed before the switch (:meth:`warm`): started while the current plan trains, it
imports torch and builds its engine for the rank the candidate plan gives it (layers, optimizers,
data), everything but the process groups. :meth:`reform` then adopts that engine when the plan
and rank are the same, so the switch pays only the rendezvous and the layers moved to it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, replace
from typing import Any

import ray

from orchestrator.runtime.actor import WorkerActor

_Base: Any = WorkerActor.__ray_actor_class__  # type: ignore[attr-defined]


class ElasticWorker(_Base):  # type: ignore[misc]
    """One rank; ``train_step`` leaves its update pending until the step commits."""

    def __init__(
        self, job: Any, plan_json: str, rank: int, emulated_slowdown: float | None
    ) -> None:
        super().__init__(job, plan_json, rank, emulated_slowdown)
        self._pending_step: int | None = None
        self._lock = threading.Lock()
        self._throttle = 1.0  # emulated extra slowdown of this node (``set_throttle``)
        self._created_unix_s = time.time()  # the process is up and this actor constructed
        # Engine builds (warm, reform) one at a time: a reform issued while a warm-up still runs
        # on the other thread waits for it and adopts what it built.
        self._build_lock = threading.Lock()
        self._warm_engine: tuple[str, int, float, Any] | None = None  # plan, rank, slowdown, engine
        self._import_s: float | None = None  # what importing the engine (torch) took here

    def train_step(self, step: int) -> dict[str, Any]:
        """Forward, backward, all-reduce of step ``step``; the update of step ``step - 1``
        (committed, since the driver only starts ``step`` after it) is applied first."""
        e = self._engine
        if e is None:
            raise RuntimeError("call setup() before train_step()")
        start_s = e.begin_step()
        self._settle(step)
        # The weights now hold ``step`` committed steps (the last update applied just above, or
        # restored): evaluate them here, untimed, when the step before was an evaluated one.
        eval_loss, eval_s = None, 0.0
        every = e.config.eval_every
        evaluated = every > 0 and step > 0 and step % every == 0  # evaluate.is_eval_step(step - 1)
        if evaluated:
            eval_start_s = time.perf_counter()
            eval_loss = e.validation_loss()
            eval_s = time.perf_counter() - eval_start_s
        loss = e.compute_gradients(step)
        with self._lock:
            self._pending_step = step
        result = e.step_result(step, loss, start_s + eval_s)
        if evaluated:
            result = replace(result, eval_loss=eval_loss, eval_after_steps=step)
        return asdict(result)

    def get_layer_states(self, committed_steps: int | None = None) -> dict[int, dict[str, Any]]:
        """This rank's layers after ``committed_steps`` steps (None: after every step it ran)."""
        self._settle(committed_steps)
        return dict(self._engine.get_layer_states())

    def export_layers(self, committed_steps: int, layers: list[int]) -> dict[int, dict[str, Any]]:
        """``layers`` of this rank after ``committed_steps`` steps, for a peer to adopt.

        Layers this rank holds whole go as they are; a tensor-parallel slice or a shard group's
        slice goes in the engine's part form (``get_layer_states``; a shard group's every layer
        with it, as its slices cut their joint state), for the receiver to join with the other
        parts of the copy.
        """
        self._settle(committed_steps)
        e = self._engine
        parted = e.spec.tp > 1 or (e.sharding is not None and bool(set(layers) & e.sharding.layers))
        if parted:
            states = e.get_layer_states()
            wanted = set(layers)
            if e.sharding is not None:
                for g in e.sharding.groups:
                    if wanted & set(g.group.layers):
                        wanted |= set(g.group.layers)
            return {i: states[i] for i in sorted(wanted)}
        return {
            i: {"params": e.layers[i].state_dict(), "optimizer": e.optimizers[i].state_dict()}
            for i in layers
        }

    def write_checkpoint(
        self,
        staging: str,
        committed_steps: int,
        copies: dict[int, tuple[int, ...]],
        peers: list[int],
        *peer_states: dict[int, dict[str, Any]],
    ) -> dict[str, tuple[str, int]]:
        """Write the whole state of each layer in ``copies`` (layer -> the ranks of the copy this
        rank writes, this rank first) after ``committed_steps`` steps into ``staging``; return
        file -> (sha256, bytes). ``peer_states``: the :meth:`get_layer_states` answers of
        ``peers`` (the other ranks of tensor-parallel or sharded copies), which Ray resolves
        before this call runs, so their bytes come actor to actor."""
        from pathlib import Path

        from orchestrator.runtime.group import whole_states
        from orchestrator.worker.checkpoint import write_layers

        self._settle(committed_steps)
        e = self._engine
        wanted = set(copies)
        if e.sharding is not None:  # a shard group's slices cut its layers' joint state
            for g in e.sharding.groups:
                if wanted & set(g.group.layers):
                    wanted |= set(g.group.layers)
        answers = [(self._rank, e.get_layer_states()), *zip(peers, peer_states, strict=True)]
        parts = {rank: {i: st for i, st in got.items() if i in wanted} for rank, got in answers}
        return write_layers(Path(staging), whole_states(parts, copies))

    def load_checkpoint_layers(self, files: Any) -> int:
        """Read this rank's layers of a checkpoint (``files``: a ``LayerFiles`` reference naming
        them), each file's sha256 checked against the manifest, and load them as
        ``set_layer_states`` does (cut for this rank's tp position or shard slice). Returns the
        bytes read. A missing, corrupt or unloadable file raises ``CheckpointError`` naming it;
        nothing is loaded then."""
        from orchestrator.worker.checkpoint import read_layer_files

        states = read_layer_files(files)
        self._engine.set_layer_states(states)
        return _nbytes(states)

    def read_checkpoint_layers(self, files: Any) -> tuple[dict[int, dict[str, Any]], int]:
        """Read and verify the layers ``files`` names (as :meth:`load_checkpoint_layers`)
        without loading them: (whole states, bytes read), for a tensor-parallel stage's ranks
        to take from this node's object store (called with two returns; needs no engine)."""
        from orchestrator.worker.checkpoint import read_layer_files

        states = read_layer_files(files)
        return states, _nbytes(states)

    def warm(self, plan_json: str, rank: int) -> dict[str, Any]:
        """Import torch and build the engine of ``rank`` in ``plan_json`` without joining any
        process group, for a later :meth:`reform` into that rank to adopt. Returns the seconds
        each part took and when this actor was constructed (wall time).

        The work runs on a thread at the lowest CPU priority (``background.py``): where the
        joiner shares CPUs with the ranks that train meanwhile, it takes only what they leave."""
        from orchestrator.runtime.elastic.background import run_at_low_priority

        with self._build_lock:
            result, nice = run_at_low_priority(lambda: self._warm(plan_json, rank))
            return {**result, "nice": nice}

    def _warm(self, plan_json: str, rank: int) -> dict[str, Any]:
        """The warm-up itself (under the build lock, on the low-priority thread)."""
        import_start_s = time.perf_counter()
        from orchestrator.runtime.actor import engine_config  # imports nothing heavy
        from orchestrator.worker.engine import StageEngine  # imports torch

        if self._import_s is None:  # the first warm-up imports; a later one finds it done
            self._import_s = time.perf_counter() - import_start_s
        build_start_s = time.perf_counter()
        slowdown = self._slowdown()
        engine = StageEngine(engine_config(self._job, plan_json, rank, slowdown))
        self._warm_engine = (plan_json, rank, slowdown, engine)
        return {
            "rank": rank,
            "pid": os.getpid(),
            "created_unix_s": self._created_unix_s,
            "import_s": self._import_s,
            "build_s": time.perf_counter() - build_start_s,
            "ready_unix_s": time.time(),
        }

    def _slowdown(self) -> float:
        """The emulated slowdown this actor's engines run at (1.0 where a real GPU is)."""
        from orchestrator.runtime.actor import has_real_gpu

        emulated = self._emulated_slowdown is not None and not has_real_gpu()
        return self._emulated_slowdown if emulated and self._emulated_slowdown else 1.0

    def _engine_for(self, plan_json: str, rank: int, slowdown: float) -> tuple[Any, bool]:
        """The engine warmed for this rank if there is one, else a new one; whether warmed."""
        from orchestrator.runtime.actor import engine_config
        from orchestrator.worker.engine import StageEngine

        warmed, self._warm_engine = self._warm_engine, None
        if warmed is not None and warmed[:3] == (plan_json, rank, slowdown):
            return warmed[3], True
        return StageEngine(engine_config(self._job, plan_json, rank, slowdown)), False

    def reform(self, *args: Any) -> dict[str, Any]:
        """Become a rank of a new plan: :meth:`_reform`'s arguments, under the build lock."""
        from orchestrator.runtime.elastic.background import hurry
        from orchestrator.runtime.local_nodes import end_emulated_boot

        # On an emulated node that booted at low priority, training starts here at the normal
        # priority (emulation only: see runtime/local_nodes.py); first, so hurry() raises too.
        end_emulated_boot()
        hurry()  # a warm-up still running at low priority: this switch waits for it
        with self._build_lock:
            return self._reform(*args)

    def _reform(
        self,
        plan_json: str,
        rank: int,
        rendezvous: tuple[str, int, int, float],
        committed_steps: int,
        keep: bool,
        incoming: list[Any],
        throttle: float = 1.0,
    ) -> dict[str, Any]:
        """Become ``rank`` of a new plan.

        ``rendezvous`` is (address, port, world size, timeout in s); ``keep``: keep the layers
        this actor holds and the new rank holds too (only when they are at ``committed_steps``);
        ``incoming``: object references of ``{layer: state}`` from peers or the in-memory
        checkpoint, or a ``LayerFiles`` reference of a checkpoint's files, read here;
        ``throttle``: the node's emulated extra slowdown (see :meth:`set_throttle`).
        """
        from orchestrator.runtime.actor import has_real_gpu
        from orchestrator.runtime.elastic.restore import resolve_incoming

        started_s = time.perf_counter()
        self._settle(committed_steps)
        old = self._engine
        if old is not None:
            old.shutdown()  # the old process group; its layers stay in memory below
        self._engine = None
        self._plan_json, self._rank = plan_json, rank
        real_gpu = has_real_gpu()
        emulated = self._emulated_slowdown is not None and not real_gpu
        slowdown = self._slowdown()
        new, warmed = self._engine_for(plan_json, rank, slowdown)
        if old is not None and _same_work(old, new):
            new.stretcher.adopt_references(old.stretcher)  # the same emulated device
        built_s = time.perf_counter()
        parts: dict[int, list[dict[str, Any]]] = {}
        # Ray objects from peers (or the in-memory checkpoint); a checkpoint's files read here.
        for part in resolve_incoming(incoming):
            for i, state in part.items():
                parts.setdefault(i, []).append(state)
        moved = _join_parts(parts)
        # Kept in place only what both engines hold whole at tp 1: a tensor-parallel slice or a
        # sharded optimizer slice is not a layer the new engine could adopt as it is.
        whole_before = set() if old is None else _whole_layers(old)
        kept = []
        late: dict[int, dict[str, Any]] = {}
        for i in list(new.layers):
            if i in moved and new.spec.tp > 1:
                late[i] = moved[i]  # cut for this tp position once the layer is split (setup)
            elif i in moved:
                new.layers[i].load_state_dict(moved[i]["params"])
                new.optimizers[i].load_state_dict(_clone(moved[i]["optimizer"]))
            elif keep and old is not None and i in whole_before and new.spec.tp == 1:
                new.layers[i], new.optimizers[i] = old.layers[i], old.optimizers[i]
                kept.append(i)
            elif keep:
                raise RuntimeError(f"rank {rank}: layer {i} neither kept nor sent")
        loaded_s = time.perf_counter()
        address, port, world_size, timeout_s = rendezvous
        new.setup(address, port, world_size, timeout_s)
        self._store_ahead = None  # served ahead by this rank 0 (where()): the group holds it now
        joined_s = time.perf_counter()
        if late:
            from orchestrator.worker.tensor_parallel import load_local

            for i, state in late.items():
                load_local(new.layers[i], new.optimizers[i], state, new.spec)
        self._engine = new
        throttled = self._apply_throttle(throttle)
        return {
            "rank": rank,
            "slowdown_factor": slowdown,
            "emulated": emulated or throttled,
            "real_gpu": real_gpu,
            "kept_layers": kept,
            "bytes_in": _nbytes(moved),
            "pid": os.getpid(),
            "warmed": warmed,
            # Where this actor's part of the switch went (seconds).
            "build_s": built_s - started_s,
            "load_s": loaded_s - built_s,  # waiting for and loading the layers sent to it
            "rendezvous_s": joined_s - loaded_s,
        }

    def leave_group(self) -> None:
        """Leave the torch process groups now, keeping the engine and its layers (its step has
        returned; the re-formation builds new groups): peers still waiting on this rank in a
        collective or a point-to-point exchange see the connection close and fail at once
        (the engine drops its handles to the subgroups too: see ``StageEngine.leave_groups``)."""
        if self._engine is not None:
            self._engine.leave_groups()

    def settle(self, committed_steps: int) -> None:
        """Apply the pending update if its step is committed, else drop it (a shard group's
        holders settle together: its update ends in collectives among them)."""
        self._settle(committed_steps)

    def set_throttle(self, factor: float) -> dict[str, Any]:
        """Run ``factor`` times slower than the node's labelled speed from the next piece of
        work on (1.0: back to it); it also holds for engines this actor builds later.

        Emulation only (it stands in for thermal throttling): where a real GPU is present nothing
        changes and the answer says ``emulated: False``. Safe during a step (a second thread):
        the stretch of each later forward, backward and update uses the new factor.
        """
        from orchestrator.runtime.actor import has_real_gpu

        if has_real_gpu():
            return {"rank": self._rank, "emulated": False, "factor": 1.0}
        throttled = self._apply_throttle(factor)
        return {"rank": self._rank, "emulated": throttled, "factor": self._throttle}

    def _apply_throttle(self, factor: float) -> bool:
        """Set the throttle on the current engine; whether it now stretches anything."""
        from orchestrator.runtime.actor import has_real_gpu
        from orchestrator.worker.emulation import Stretcher

        if has_real_gpu():
            return False
        Stretcher(1.0).throttle(factor)  # checks the factor before anything changes
        self._throttle = factor
        e = self._engine
        if e is not None:
            e.stretcher.throttle(factor)
        return factor != 1.0

    def _settle(self, committed_steps: int | None) -> None:
        """Apply the pending update if its step is committed, else drop it."""
        with self._lock:
            pending, self._pending_step = self._pending_step, None
            if pending is None:
                return
            if committed_steps is None or pending < committed_steps:
                self._engine.apply_update()
            # else: the step did not commit everywhere; its gradients are zeroed next step


def _whole_layers(engine: Any) -> set[int]:
    """Layers the engine holds whole, with their own optimizer (tp 1, not sharded)."""
    if engine.spec.tp > 1:
        return set()
    sharded = engine.sharding.layers if engine.sharding is not None else set()
    return {i for i in engine.layers if i in engine.optimizers and i not in sharded}


def _join_parts(parts: dict[int, list[dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    """Layer -> whole state from the parts peers sent (one whole state, or the slices of a
    tensor-parallel stage or shard group, joined)."""
    from orchestrator.worker.sharding import ZERO_KEY, merge_sharded_states
    from orchestrator.worker.tensor_parallel import SHARD_KEY

    chosen: dict[int, list[dict[str, Any]]] = {}
    for i, got in parts.items():
        # A shard group's exporters send every layer of the group: where a layer also came
        # whole (or as another copy's slices), one form is used, the sharded slices first.
        zero = [p for p in got if ZERO_KEY in p]
        sliced = [p for p in got if SHARD_KEY in p]
        chosen[i] = zero or sliced or got[:1]
    return {i: dict(state) for i, state in merge_sharded_states(chosen).items()}


def _nbytes(obj: Any) -> int:
    """Bytes of the tensors in ``obj`` (the state moved to this actor)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_nbytes(v) for v in obj)
    return 0


def _clone(obj: Any) -> Any:
    """A writable copy (states from the object store may share read-only memory)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


# Same Ray options as the plain worker: no restarts (a lost rank is the controller's business),
# two threads (see the module docstring).
ElasticWorkerActor = ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=2)(
    ElasticWorker
)


def _same_work(old: Any, new: Any) -> bool:
    """Whether two engines' stretched pieces of work are the same (the same whole layers in the
    same place of the pipeline, unsharded, at the same precision), so that the reference CPU
    times one measured hold for the other (``Stretcher.adopt_references``)."""
    from orchestrator.worker.topology import Sharding

    a, b = old.spec, new.spec
    return (
        a.layers == b.layers
        and (a.stage == 0) == (b.stage == 0)
        and (a.stage == a.num_stages - 1) == (b.stage == b.num_stages - 1)
        and a.tp == b.tp == 1
        and a.sharding == b.sharding == Sharding.NONE
        and old.policy == new.policy
    )

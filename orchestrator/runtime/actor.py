"""The worker actor: one Ray actor per device, wrapping the worker side's ``StageEngine``.

torch is imported inside the actor's methods only, so importing this module (in the driver or the
controller) stays light. The actor decides about emulation itself: it applies the slowdown the
driver computed from its node's ``orchestrator.io/emulated-speed`` label only when it sees no real
GPU, so emulation never switches on where real GPUs exist.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass, field
from typing import Any

import ray

from orchestrator.spec.model import Optimizer, Schedule


@dataclass(frozen=True)
class WorkerJob:
    """What every worker of a job needs, as plain data (pickled to the actors).

    ``data`` holds the worker side's data settings as keyword arguments of its ``DataConfig``.
    """

    model_factory: str
    model_kwargs: dict[str, Any]
    data: dict[str, Any]
    schedule: Schedule = Schedule.ONE_F_ONE_B
    optimizer: Optimizer = Optimizer.ADAM
    learning_rate: float = 3e-4
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def has_real_gpu() -> bool:
    """Whether this process sees a real CUDA device (fake Ray GPUs do not count)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)


def free_port() -> int:
    """A TCP port free on this host right now (the rendezvous binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def engine_config(job: WorkerJob, plan_json: str, rank: int, slowdown_factor: float) -> Any:
    """Build the worker side's ``EngineConfig`` from plain data (inside the actor)."""
    from orchestrator.spec.plan import Plan
    from orchestrator.worker.engine import DataConfig, EngineConfig

    plan = Plan.model_validate_json(plan_json)
    extra = dict(job.extra)
    if plan.precision is not None:
        # The plan was costed in its format: the workers compute in exactly it (a job whose
        # training.precision names another is refused before the run starts).
        extra["precision"] = plan.precision.value
    return EngineConfig(
        model_factory=job.model_factory,
        model_kwargs=dict(job.model_kwargs),
        plan=plan,
        rank=rank,
        schedule=job.schedule,
        optimizer=job.optimizer,
        learning_rate=job.learning_rate,
        seed=job.seed,
        data=DataConfig(**job.data),
        slowdown_factor=slowdown_factor,
        **extra,
    )


# Two threads: one runs the engine's calls (the driver issues them one phase at a time), the other
# answers ping() while a step is blocked in a collective, so the driver can tell a dead peer from a
# live one that is waiting on it.
@ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=2)
class WorkerActor:
    """One rank of a worker group. Methods mirror ``StageEngine``'s; results are plain data."""

    def __init__(
        self, job: WorkerJob, plan_json: str, rank: int, emulated_slowdown: float | None
    ) -> None:
        """``emulated_slowdown``: None on a node without an emulated speed, else its factor."""
        self._job = job
        self._plan_json = plan_json
        self._rank = rank
        self._emulated_slowdown = emulated_slowdown
        self._engine: Any = None
        # The next rendezvous' store, served by this rank 0 ahead of the ranks (see where()).
        self._store_ahead: Any = None

    def ping(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, Any]:
        """This actor's host address, a port on it for the next rendezvous, its node id and
        process id. Asked of the rank 0 of a rendezvous: where torch is loaded, the rendezvous'
        store is served on that port from now on, so no rank that joins first waits out torch's
        connect back-off (``worker/store_ahead.py``); elsewhere the port is a free one."""
        from orchestrator.worker.store_ahead import serve

        ctx = ray.get_runtime_context()
        address = ray.util.get_node_ip_address()
        self._store_ahead = serve(address)  # replaces one served for a rendezvous never held
        port = self._store_ahead.port if self._store_ahead is not None else free_port()
        return {"address": address, "port": port, "node_id": ctx.get_node_id(), "pid": os.getpid()}

    def setup(
        self, master_addr: str, master_port: int, world_size: int, timeout_s: float
    ) -> dict[str, Any]:
        """Build the engine (model layers, optimizer, process groups) and join the rendezvous."""
        from orchestrator.worker.engine import StageEngine

        real_gpu = has_real_gpu()
        # Real devices run at their own speed: never emulate over them.
        emulated = self._emulated_slowdown is not None and not real_gpu
        slowdown = self._emulated_slowdown if emulated and self._emulated_slowdown else 1.0
        config = engine_config(self._job, self._plan_json, self._rank, slowdown)
        self._engine = StageEngine(config)
        self._engine.setup(master_addr, master_port, world_size, timeout_s)
        self._store_ahead = None  # the world group holds the server now
        return {
            "rank": self._rank,
            "slowdown_factor": slowdown,
            "emulated": emulated,
            "real_gpu": real_gpu,
        }

    def train_step(self, step: int) -> dict[str, Any]:
        result = self._engine.train_step(step)
        return asdict(result) if hasattr(result, "__dataclass_fields__") else dict(result)

    def get_layer_states(self) -> dict[int, dict[str, Any]]:
        return dict(self._engine.get_layer_states())

    def set_layer_states(self, states: dict[int, dict[str, Any]]) -> None:
        self._engine.set_layer_states(states)

    def save_checkpoint(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call a checkpoint method of the engine (the worker side owns the format)."""
        return getattr(self._engine, method)(*args, **kwargs)

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

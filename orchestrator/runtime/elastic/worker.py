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
"""

from __future__ import annotations

import threading
from dataclasses import asdict
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

    def train_step(self, step: int) -> dict[str, Any]:
        """Forward, backward, all-reduce of step ``step``; the update of step ``step - 1``
        (committed, since the driver only starts ``step`` after it) is applied first."""
        e = self._engine
        if e is None:
            raise RuntimeError("call setup() before train_step()")
        start_s = e.begin_step()
        self._settle(step)
        loss = e.compute_gradients(step)
        with self._lock:
            self._pending_step = step
        return asdict(e.step_result(step, loss, start_s))

    def get_layer_states(self, committed_steps: int | None = None) -> dict[int, dict[str, Any]]:
        """This rank's layers after ``committed_steps`` steps (None: after every step it ran)."""
        self._settle(committed_steps)
        return dict(self._engine.get_layer_states())

    def pending_step(self) -> int | None:
        """The step whose update is reduced but not yet applied (tests read it)."""
        return self._pending_step

    def _settle(self, committed_steps: int | None) -> None:
        """Apply the pending update if its step is committed, else drop it."""
        with self._lock:
            pending, self._pending_step = self._pending_step, None
            if pending is None:
                return
            if committed_steps is None or pending < committed_steps:
                self._engine.apply_update()
            # else: the step did not commit everywhere; its gradients are zeroed next step


# Same Ray options as the plain worker: no restarts (a lost rank is the controller's business),
# two threads (see the module docstring).
ElasticWorkerActor = ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=2)(
    ElasticWorker
)

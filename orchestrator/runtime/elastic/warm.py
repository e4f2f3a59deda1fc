"""Actors started and warmed for a candidate plan while the current plan trains.

:meth:`~orchestrator.runtime.elastic.survivors.ElasticWorkerGroup.prepare` starts one for each
rank of a candidate plan that no running actor would take (a rank pinned to a new node); the
actor imports torch and builds that rank's engine (``ElasticWorker.warm``). The pool says without
blocking whether the actors warming for a plan are ready, and a reform takes them by node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from orchestrator.control.ports import WarmStatus
from orchestrator.runtime.group import WorkerInfo
from orchestrator.runtime.placement import PlacedGroup


@dataclass
class WarmActor:
    """An actor started for a rank of a candidate plan before the switch."""

    actor: Any
    placed: PlacedGroup  # created, maybe not ready yet
    info: WorkerInfo
    uses_gpus: bool
    target: tuple[str, int]  # (plan json, rank) it is warming for
    ref: Any  # its latest warm() call
    asked_unix_s: float  # when the actor was asked for (its warm-up counts from there)
    result: dict[str, Any] | None = None

    def rewarm(self, plan_json: str, rank: int) -> None:
        """Build the engine of ``rank`` of ``plan_json`` instead (a no-op if it already is)."""
        if self.target != (plan_json, rank):
            self.target, self.result = (plan_json, rank), None
            self.ref = self.actor.warm.remote(plan_json, rank)

    def stop(self) -> None:
        with contextlib.suppress(Exception):  # already dead
            ray.kill(self.actor, no_restart=True)
        remove_placed(self.placed)


@dataclass
class WarmPool:
    """The warm actors no plan has taken yet."""

    actors: list[WarmActor] = field(default_factory=list)

    def take(self, node_id: str | None, uses_gpus: bool) -> WarmActor | None:
        """Remove and return a warm actor on ``node_id`` of that kind, if there is one."""
        w = next(
            (w for w in self.actors if w.info.node_id == node_id and w.uses_gpus == uses_gpus),
            None,
        )
        if w is not None:
            self.actors.remove(w)
        return w

    def warming_for(self, plan_json: str) -> list[WarmActor]:
        return [w for w in self.actors if w.target[0] == plan_json]

    def status(self, plan_json: str) -> WarmStatus:
        """Whether every actor warming for ``plan_json`` is warm (never blocks); one that failed
        is stopped and the status says why."""
        mine = self.warming_for(plan_json)
        waiting = [w for w in mine if w.result is None]
        if waiting:
            ready, _ = ray.wait([w.ref for w in waiting], num_returns=len(waiting), timeout=0)
            done = set(ready)
            for w in waiting:
                if w.ref not in done:
                    continue
                try:
                    w.result = ray.get(w.ref, timeout=0)
                except Exception as exc:  # its node went, or the engine could not be built
                    self.actors.remove(w)
                    w.stop()
                    return WarmStatus(
                        "failed", f"warming rank {w.target[1]} on {w.info.node_id}: {exc}"
                    )
        if any(w.result is None for w in mine):
            return WarmStatus("warming")
        return WarmStatus("ready", seconds=warm_seconds(mine))

    def stop_all(self) -> None:
        pool, self.actors = self.actors, []
        for w in pool:
            w.stop()


def warm_seconds(warm: Sequence[WarmActor]) -> dict[str, float]:
    """The slowest warm actor's time by part: asked -> actor constructed (placement, process
    start), torch imported, engine built; and asked -> ready in all."""
    out = {"start_s": 0.0, "import_s": 0.0, "build_s": 0.0, "total_s": 0.0}
    for w in warm:
        r = w.result or {}
        parts = {
            "start_s": float(r.get("created_unix_s", w.asked_unix_s)) - w.asked_unix_s,
            "import_s": float(r.get("import_s", 0.0)),
            "build_s": float(r.get("build_s", 0.0)),
            "total_s": float(r.get("ready_unix_s", w.asked_unix_s)) - w.asked_unix_s,
        }
        if parts["total_s"] >= out["total_s"]:
            out = parts
    return out


def remove_placed(placed: PlacedGroup) -> None:
    with contextlib.suppress(Exception):  # the placement group went with its node
        placed.remove()

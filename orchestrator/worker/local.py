"""Run a plan in local processes, without Ray: one spawned process per rank, gloo on loopback.

For tests, benchmarks of the engine alone and quick experiments on one machine. The Ray side does
the same with one actor per rank; the engine is identical.
"""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from orchestrator.worker import sharding, topology
from orchestrator.worker.engine import EngineConfig, StageEngine, StepResult


@dataclass(frozen=True)
class LocalRun:
    """What every rank returned: its step results and its final layer states."""

    results: dict[int, list[StepResult]]  # rank -> one result per step
    # planner layer -> state, taken from the layer's holder in the lowest replica
    layer_states: dict[int, dict[str, Any]]


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_local(
    base: EngineConfig,
    steps: range,
    slowdown_by_device: dict[str, float] | None = None,
    initial_states: dict[int, dict[str, Any]] | None = None,
    timeout_s: float = 120,
) -> LocalRun:
    """Train ``steps`` with one process per rank of ``base.plan``; ``base.rank`` is ignored.

    ``slowdown_by_device`` sets each rank's emulation factor from its stage's device type.
    ``initial_states`` (planner layer -> state) is loaded into every rank before the first step.
    """
    specs = topology.ranks_for_plan(base.plan)
    factors = slowdown_by_device or {}
    configs = [
        replace(base, rank=s.rank, slowdown_factor=factors.get(s.device_type, 1.0)) for s in specs
    ]
    port = free_port()
    sources = topology.shard_sources(base.plan)
    with tempfile.TemporaryDirectory(prefix="orchestrator-local-") as tmp:
        out = Path(tmp)
        mp.spawn(
            _rank_main,
            args=(configs, list(steps), port, initial_states, out, timeout_s),
            nprocs=len(configs),
            join=True,
        )
        results: dict[int, list[StepResult]] = {}
        parts: dict[int, list[dict[str, Any]]] = {}
        for s in specs:
            saved = torch.load(out / f"rank-{s.rank}.pt", weights_only=False)
            results[s.rank] = saved["results"]
            for layer, state in saved["states"].items():
                if s.rank in sources[layer]:
                    parts.setdefault(layer, []).append(state)
    # Whole (tp-1, unsharded) states: a tensor-parallel stage's parts and the sharded holders'
    # slices are joined here, at the edge.
    states = sharding.merge_sharded_states(parts)
    return LocalRun(results=results, layer_states=states)


def _rank_main(
    rank: int,
    configs: list[EngineConfig],
    steps: list[int],
    port: int,
    initial_states: dict[int, dict[str, Any]] | None,
    out: Path,
    timeout_s: float,
) -> None:
    # One intra-op thread per rank: several ranks share this machine's cores.
    torch.set_num_threads(int(os.environ.get("ORCHESTRATOR_LOCAL_THREADS", "1")))
    engine = StageEngine(configs[rank])
    try:
        engine.setup("127.0.0.1", port, len(configs), timeout_s)
        if initial_states is not None:
            engine.set_layer_states(initial_states)
        results = [engine.train_step(step) for step in steps]
        payload = {"results": results, "states": engine.get_layer_states()}
        tmp = out / f".rank-{rank}.pt.tmp"
        torch.save(payload, tmp)
        tmp.rename(out / f"rank-{rank}.pt")
    finally:
        engine.shutdown()

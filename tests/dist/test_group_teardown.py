"""Leaving the groups of a plan destroys every subgroup, the tensor-parallel ones too.

A tp-2 stage and a tp-1 replica sharing its layers (a tp group, gradient groups, the tied
embedding's group) train a step in three spawned gloo ranks; each rank then leaves its groups as
a survivor does before a re-formation (``StageEngine.leave_groups``). Every subgroup it built must
have been destroyed by name before the world group, the tp mesh kept in the layers' parameters
must no longer resolve its group, and the registry of built groups must be empty. The same
processes then re-form (a new world on another port) and train the step again: the same loss.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from dist_cases import engine_config
from test_tensor_parallel import tp_plan

from orchestrator.worker import subgroups, topology
from orchestrator.worker.engine import EngineConfig, StageEngine
from orchestrator.worker.local import free_port

PLAN = tp_plan([(4, [((0, 5), 2)]), (4, [((0, 5), 1)])])


def _mesh_of(engine: StageEngine) -> Any:
    """The device mesh of a DTensor parameter of this rank's layers (None at tp 1)."""
    for layer in engine.layers.values():
        for p in layer.parameters():
            mesh = getattr(p, "device_mesh", None)
            if mesh is not None:
                return mesh
    return None


def _rank_main(rank: int, configs: list[EngineConfig], ports: list[int], out: Path) -> None:
    torch.set_num_threads(1)
    destroyed: list[Any] = []
    real_destroy = dist.destroy_process_group

    def spy(group: Any = None) -> None:
        destroyed.append(group)
        real_destroy(group)

    dist.destroy_process_group = spy  # type: ignore[assignment]  # this process only
    config = configs[rank]
    engine = StageEngine(config)
    engine.setup("127.0.0.1", ports[0], len(configs), 60)
    first = engine.train_step(0)
    built = subgroups.live()
    mesh = _mesh_of(engine)
    tp_group = mesh.get_group() if mesh is not None else None

    engine.leave_groups()
    world_last = destroyed[-1] is None and all(g is not None for g in destroyed[:-1])
    by_name = [id(g) for g in destroyed[:-1]]
    mesh_resolves = False  # no mesh at tp 1
    if mesh is not None:
        mesh_resolves = True
        try:
            mesh.get_group()
        except RuntimeError:
            mesh_resolves = False
    after = len(subgroups.live())

    again = StageEngine(config)  # the re-formation: a new engine, new groups, a new world
    again.setup("127.0.0.1", ports[1], len(configs), 60)
    rebuilt = len(subgroups.live())
    second = again.train_step(0)
    again.shutdown()
    torch.save(
        {
            "built": len(built),
            "all_destroyed": sorted(id(g) for g in built) == sorted(by_name),
            "tp_destroyed": tp_group is None or id(tp_group) in by_name,
            "has_mesh": mesh is not None,
            "world_last": world_last,
            "mesh_resolves": mesh_resolves,
            "left_after_leave": after,
            "rebuilt": rebuilt,
            "left_after_shutdown": len(subgroups.live()),
            "losses": (first.loss, second.loss),
        },
        out / f"rank-{rank}.pt",
    )


@pytest.mark.slow
def test_leaving_destroys_every_subgroup_and_the_ranks_reform_and_train(tmp_path: Path) -> None:
    specs = topology.ranks_for_plan(PLAN)
    configs = [replace(engine_config(PLAN), rank=s.rank) for s in specs]
    ports = [free_port(), free_port()]
    mp.spawn(_rank_main, args=(configs, ports, tmp_path), nprocs=len(configs), join=True)
    got = {s.rank: torch.load(tmp_path / f"rank-{s.rank}.pt") for s in specs}
    tp_ranks = {s.rank for s in specs if s.tp > 1}
    assert len(tp_ranks) == 2
    for rank, r in got.items():
        assert r["built"] >= 1, (rank, r)  # gradient groups on every rank
        assert r["has_mesh"] == (rank in tp_ranks)
        assert r["all_destroyed"] and r["tp_destroyed"] and r["world_last"], (rank, r)
        assert not r["mesh_resolves"], (rank, r)  # the old tp group cannot be used
        assert r["left_after_leave"] == 0 and r["left_after_shutdown"] == 0, (rank, r)
        assert r["rebuilt"] == r["built"], (rank, r)
    # The last stage of each replica reports its loss share: the same after the re-formation.
    shares = [r["losses"] for r in got.values() if r["losses"][0] is not None]
    assert len(shares) == len(PLAN.replicas)
    for before, after in shares:
        assert after == pytest.approx(before, rel=1e-6)

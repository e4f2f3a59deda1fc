"""What the controller restores when ranks of a tensor-parallel stage or a shard group are lost.

The Ray port names, per layer, the lowest rank of every copy with no lost rank
(``topology.layer_copies``): a copy is a tp stage's ranks or a shard group's sharded holders, so
one lost rank loses the copy for all of them. The controller's restore choice then reads the
layer from another copy, or falls back to the checkpoint and counts the lost steps.
"""

from __future__ import annotations

from orchestrator.control.recovery import CheckpointRef, RestoreKind, choose_restore
from orchestrator.runtime.actor import WorkerJob
from orchestrator.runtime.elastic.checkpoints import MemoryCheckpointStore
from orchestrator.runtime.elastic.group_port import RayWorkerGroupPort
from orchestrator.spec.plan import Plan

# rank 0: layers 0-1; ranks 1-2: layers 2-3 at tp 2; ranks 3, 4: whole models sharding together.
PLAN = Plan.model_validate(
    {
        "global_batch_size": 6,
        "microbatch_size": 1,
        "replicas": [
            {
                "batch_size": 2,
                "stages": [
                    {"layers": [0, 2], "device_type": "A"},
                    {"layers": [2, 4], "device_type": "A", "tp": 2},
                ],
            },
            {
                "batch_size": 2,
                "stages": [{"layers": [0, 4], "device_type": "A", "sharding": "optimizer"}],
            },
            {
                "batch_size": 2,
                "stages": [{"layers": [0, 4], "device_type": "A", "sharding": "optimizer"}],
            },
        ],
    }
)


def port_with_lost(ranks: set[int]) -> RayWorkerGroupPort:
    port = RayWorkerGroupPort(WorkerJob("m:f", {}, {}), MemoryCheckpointStore())
    port._plan, port._dead_ranks = PLAN, set(ranks)
    return port


def test_every_copy_alive_names_each_copy_once() -> None:
    holders = port_with_lost(set()).layer_holders()
    assert holders == {0: (0, 3), 1: (0, 3), 2: (1, 3), 3: (1, 3)}


def test_a_lost_tp_rank_restores_its_layers_from_the_shard_group() -> None:
    port = port_with_lost({2})
    holders = port.layer_holders()
    assert holders[2] == holders[3] == (3,)  # rank 1 alone is not a copy
    choice = choose_restore(
        num_layers=4, holders=holders, lost_ranks={2}, checkpoint=None, next_step=7
    )
    assert choice.kind is RestoreKind.REPLICAS and choice.lost_steps == 0
    assert choice.ranks_by_layer == {0: 0, 1: 0, 2: 3, 3: 3}


def test_no_whole_copy_left_falls_back_to_the_checkpoint_and_counts_lost_steps() -> None:
    # One tp rank and one sharded holder: layers 2-3 have no copy left (layers 0-1 do, rank 0).
    port = port_with_lost({1, 4})
    holders = port.layer_holders()
    assert holders[0] == (0,) and holders[2] == ()
    choice = choose_restore(
        num_layers=4,
        holders=holders,
        lost_ranks={1, 4},
        checkpoint=CheckpointRef(5, {}),
        next_step=7,
    )
    assert choice.kind is RestoreKind.CHECKPOINT
    assert choice.missing_layers == (2, 3) and choice.lost_steps == 2

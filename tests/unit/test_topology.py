"""Ranks, neighbours, batch slices and all-reduce groups derived from literal plans."""

from __future__ import annotations

import pytest

from orchestrator.errors import SpecError
from orchestrator.runtime.placement import slots_for_plan
from orchestrator.spec.plan import Plan, Sharding
from orchestrator.worker import topology
from orchestrator.worker.schedule import (
    BACKWARD,
    FORWARD,
    actions_for,
    microbatch_sizes,
    one_f_one_b,
)


def make_plan(replicas: list[tuple[int, list[tuple[tuple[int, int], str]]]], mbs: int = 1) -> Plan:
    return Plan.model_validate(
        {
            "global_batch_size": sum(b for b, _ in replicas),
            "microbatch_size": mbs,
            "replicas": [
                {
                    "batch_size": b,
                    "stages": [{"layers": list(layers), "device_type": d} for layers, d in stages],
                }
                for b, stages in replicas
            ],
        }
    )


# Replica 0 cuts 6 layers at 3, replica 1 at 2 and 4; 5:3 batch shares.
SKEWED = make_plan(
    [
        (5, [((0, 3), "A100"), ((3, 6), "A100")]),
        (3, [((0, 2), "T4"), ((2, 4), "T4"), ((4, 6), "L4")]),
    ]
)


def test_ranks_are_replica_major_with_neighbours_and_slices() -> None:
    specs = topology.ranks_for_plan(SKEWED)
    assert [(s.rank, s.replica, s.stage) for s in specs] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1), (4, 1, 2),
    ]  # fmt: skip
    assert [(s.prev_rank, s.next_rank) for s in specs] == [
        (None, 1), (0, None), (None, 3), (2, 4), (3, None),
    ]  # fmt: skip
    # replica 0 takes samples [0, 5), replica 1 [5, 8)
    assert [(s.replica_batch_size, s.replica_sample_offset) for s in specs] == [
        (5, 0), (5, 0), (3, 5), (3, 5), (3, 5),
    ]  # fmt: skip
    assert specs[4].device_type == "L4"
    assert specs[4].layers == (4, 6)
    assert topology.world_size(SKEWED) == 5


def test_layer_holders_one_rank_per_replica() -> None:
    holders = topology.layer_holders(SKEWED)
    assert holders == {0: (0, 2), 1: (0, 2), 2: (0, 3), 3: (1, 3), 4: (1, 4), 5: (1, 4)}


def test_grad_groups_are_distinct_holder_sets_in_layer_order() -> None:
    groups = topology.grad_groups(SKEWED)
    assert [(g.ranks, g.layers) for g in groups] == [
        ((0, 2), (0, 1)),
        ((0, 3), (2,)),
        ((1, 3), (3,)),
        ((1, 4), (4, 5)),
    ]
    # every layer is in exactly one group
    assert sorted(i for g in groups for i in g.layers) == list(range(6))


def test_single_replica_needs_no_grad_groups() -> None:
    plan = make_plan([(4, [((0, 1), "A"), ((1, 3), "A"), ((3, 4), "A")])])
    assert topology.grad_groups(plan) == []
    assert topology.checkpoint_writers(plan) == {0: 0, 1: 1, 2: 1, 3: 2}


def test_checkpoint_writers_are_lowest_replica_holders() -> None:
    assert topology.checkpoint_writers(SKEWED) == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}


def test_tensor_parallel_stage_is_one_rank_per_position() -> None:
    plan = Plan.model_validate(
        {
            "global_batch_size": 2,
            "microbatch_size": 1,
            "replicas": [
                {"batch_size": 2, "stages": [{"layers": [0, 4], "device_type": "A", "tp": 2}]}
            ],
        }
    )
    # The engine and the Ray runtime run it: one rank (one actor, one slot) per tp position.
    assert [s.rank for s in topology.ranks_for_plan(plan)] == [0, 1]
    topology.check_supported(plan)
    assert [(s.rank, s.device_type) for s in slots_for_plan(plan)] == [(0, "A"), (1, "A")]


def _plan(replicas: list[dict[str, object]]) -> Plan:
    total = sum(int(r["batch_size"]) for r in replicas)  # type: ignore[call-overload]
    return Plan.model_validate(
        {"global_batch_size": total, "microbatch_size": 1, "replicas": replicas}
    )


def test_tensor_parallel_ranks_and_cross_degree_neighbours() -> None:
    # replica 0: stage 0 at tp 1, stage 1 at tp 2, stage 2 at tp 1; replica 1 whole at tp 2
    plan = _plan(
        [
            {
                "batch_size": 2,
                "stages": [
                    {"layers": [0, 1], "device_type": "A"},
                    {"layers": [1, 3], "device_type": "A", "tp": 2},
                    {"layers": [3, 4], "device_type": "A"},
                ],
            },
            {"batch_size": 1, "stages": [{"layers": [0, 4], "device_type": "A", "tp": 2}]},
        ]
    )
    specs = topology.ranks_for_plan(plan)
    assert topology.world_size(plan) == 6 == len(specs)
    s0, s1a, s1b, s2 = specs[:4]
    assert s0.next_ranks == (1, 2) and s0.prev_ranks == ()
    assert (s1a.prev_rank, s1b.prev_rank) == (0, 0)
    assert (s1a.next_rank, s1b.next_rank) == (3, 3)
    assert s1a.next_ranks == (3,) and s1b.next_ranks == ()
    assert s2.prev_ranks == (1, 2) and s2.prev_rank == 1  # both tp ranks need the gradient
    assert (s1b.tp, s1b.tp_rank, s1b.stage_ranks) == (2, 1, (1, 2))
    # the controller's (replica, stage) -> rank, used to find a stage's node, is the workers'
    assert (
        plan.first_ranks()
        == {(sp.replica, sp.stage): sp.rank for sp in specs if sp.tp_rank == 0}
        == {(0, 0): 0, (0, 1): 1, (0, 2): 3, (1, 0): 4}
    )
    assert topology.tp_groups(plan) == [(1, 2), (4, 5)]
    # layer 1 is held by the tp group of each replica; one group sums across both
    assert topology.layer_holders(plan)[1] == (1, 2, 4, 5)
    assert [(g.ranks, g.layers) for g in topology.grad_groups(plan)] == [
        ((0, 4, 5), (0,)),
        ((1, 2, 4, 5), (1, 2)),
        ((3, 4, 5), (3,)),
    ]
    assert topology.shard_sources(plan) == {0: (0,), 1: (1, 2), 2: (1, 2), 3: (3,)}


def test_single_tp_group_needs_no_grad_group() -> None:
    plan = _plan([{"batch_size": 2, "stages": [{"layers": [0, 4], "device_type": "A", "tp": 2}]}])
    assert topology.grad_groups(plan) == []


def test_engine_refuses_sharding_at_tp_and_executes_full() -> None:
    tp_sharded = _plan(
        [
            {
                "batch_size": 1,
                "stages": [
                    {"layers": [0, 4], "device_type": "A", "tp": 2, "sharding": "optimizer"}
                ],
            },
            {"batch_size": 1, "stages": [{"layers": [0, 4], "device_type": "A"}]},
        ]
    )
    with pytest.raises(SpecError, match=r"stages\[0\].sharding"):
        topology.check_executable(tp_sharded)
    with pytest.raises(SpecError, match="sharding"):
        topology.check_supported(tp_sharded)
    full = _plan(
        [
            {
                "batch_size": b,
                "stages": [{"layers": [0, 4], "device_type": "A", "sharding": "full"}],
            }
            for b in (2, 1)
        ]
    )
    topology.check_executable(full)
    topology.check_supported(full)
    (group,) = topology.shard_groups(full)
    assert group.level is Sharding.FULL and group.all_sharded
    # the two sharded holders are one copy: neither holds a layer whole by itself
    assert topology.layer_copies(full)[0] == ((0, 1),)
    assert topology.whole_layers(full, 0) == set()


def test_layer_copies_of_tensor_parallel_and_sharded_holders() -> None:
    # replica 0: tp-2 stage then a tp-1 stage; replicas 1 and 2: whole models, sharded together;
    # replica 3: a whole unsharded model.
    plan = _plan(
        [
            {
                "batch_size": 2,
                "stages": [
                    {"layers": [0, 2], "device_type": "A", "tp": 2},
                    {"layers": [2, 4], "device_type": "A"},
                ],
            },
            {
                "batch_size": 2,
                "stages": [{"layers": [0, 4], "device_type": "A", "sharding": "optimizer"}],
            },
            {
                "batch_size": 1,
                "stages": [{"layers": [0, 4], "device_type": "A", "sharding": "optimizer"}],
            },
            {"batch_size": 1, "stages": [{"layers": [0, 4], "device_type": "A"}]},
        ]
    )
    copies = topology.layer_copies(plan)
    assert copies[0] == ((0, 1), (3, 4), (5,))
    assert copies[3] == ((2,), (3, 4), (5,))
    # Only rank 2 (tp 1, unsharded) and rank 5 hold layers whole by themselves.
    assert topology.whole_layers(plan, 2) == {2, 3}
    assert topology.whole_layers(plan, 5) == {0, 1, 2, 3}
    assert topology.whole_layers(plan, 0) == topology.whole_layers(plan, 3) == set()
    assert topology.copy_of(plan, 1, 4) == (3, 4)
    with pytest.raises(KeyError):
        topology.copy_of(plan, 3, 0)


def test_a_lone_sharded_holder_keeps_its_layers_whole() -> None:
    plan = _plan(
        [
            {
                "batch_size": 1,
                "stages": [{"layers": [0, 4], "device_type": "A", "sharding": "gradients"}],
            },
            {"batch_size": 1, "stages": [{"layers": [0, 4], "device_type": "A"}]},
        ]
    )
    assert topology.layer_copies(plan)[0] == ((0,), (1,))
    assert topology.whole_layers(plan, 0) == {0, 1, 2, 3}


def test_microbatch_sizes_keep_every_sample() -> None:
    assert microbatch_sizes(5, 2) == [2, 2, 1]
    assert microbatch_sizes(4, 2) == [2, 2]
    assert microbatch_sizes(1, 4) == [1]


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
@pytest.mark.parametrize("num_mb", [1, 2, 3, 5])
def test_1f1b_runs_each_microbatch_once_forward_first(num_stages: int, num_mb: int) -> None:
    for stage in range(num_stages):
        actions = one_f_one_b(num_mb, stage, num_stages)
        forwards = [a for a in actions if a[0] == FORWARD]
        assert sorted(forwards) == [(FORWARD, i) for i in range(num_mb)]
        assert [a for a in actions if a[0] == BACKWARD] == [(BACKWARD, i) for i in range(num_mb)]
        for i in range(num_mb):
            assert actions.index((FORWARD, i)) < actions.index((BACKWARD, i))
        # at most num_stages - stage microbatches in flight (the point of 1F1B)
        in_flight = peak = 0
        for kind, _ in actions:
            in_flight += 1 if kind == FORWARD else -1
            peak = max(peak, in_flight)
        assert peak <= max(1, num_stages - stage)


def test_last_stage_of_1f1b_alternates_and_gpipe_does_all_forwards_first() -> None:
    assert one_f_one_b(3, 2, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert one_f_one_b(3, 0, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    assert actions_for("gpipe", 2, 0, 3) == [("F", 0), ("F", 1), ("B", 1), ("B", 0)]

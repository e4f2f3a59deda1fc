"""Which survivor sends which layers to the ranks of a new plan (``runtime/elastic/moves.py``)."""

from __future__ import annotations

from orchestrator.runtime.elastic.moves import live_copies, route_layers
from orchestrator.spec.plan import Plan
from orchestrator.worker.topology import ranks_for_plan, whole_layers


def _plan(replicas: list[list[tuple[tuple[int, int], int]]]) -> Plan:
    """Replicas of (layers, tp) stages on A100s, one sample per replica."""
    return Plan.model_validate(
        {
            "global_batch_size": len(replicas),
            "microbatch_size": 1,
            "replicas": [
                {
                    "batch_size": 1,
                    "stages": [
                        {"layers": list(layers), "device_type": "A100", "tp": tp}
                        for layers, tp in stages
                    ],
                }
                for stages in replicas
            ],
        }
    )


# Two replicas of two stages: ranks 0 and 2 hold layers 0-1, ranks 1 and 3 hold layers 2-3.
OLD = _plan([[((0, 2), 1), ((2, 4), 1)], [((0, 2), 1), ((2, 4), 1)]])


def test_kept_layers_stay_and_the_rest_come_from_a_live_copy() -> None:
    alive = {0, 2, 3}  # rank 1 lost
    new = ranks_for_plan(_plan([[((0, 4), 1)]]))
    held = {r: whole_layers(OLD, r) for r in alive}
    moves = route_layers(new, {0: 0}, held, live_copies(OLD, alive))
    assert (moves.kept, moves.moved) == (2, 2)
    assert moves.sources == [{3: [2, 3]}]  # rank 3 holds the only live copy of layers 2-3


def test_a_layer_whose_every_copy_is_lost_has_no_live_copy() -> None:
    copies = live_copies(OLD, {0, 2})  # both holders of layers 2-3 lost
    assert copies[0] and copies[1]
    assert copies[2] == [] and copies[3] == []


def test_a_tensor_parallel_rank_keeps_nothing_in_place() -> None:
    alive = {0, 1, 2, 3}
    new = ranks_for_plan(_plan([[((0, 2), 2), ((2, 4), 1)]]))  # ranks 0-1 at tp 2, rank 2
    held = {r: whole_layers(OLD, r) for r in alive}
    moves = route_layers(new, {0: 0, 1: 2, 2: 1}, held, live_copies(OLD, alive))
    assert moves.kept == 2  # rank 2 (tp 1) keeps layers 2-3 that its actor holds
    assert moves.moved == 4  # both tp ranks receive layers 0-1 whole
    assert all(sum(len(v) for v in s.values()) == 2 for s in moves.sources[:2])
    assert moves.sources[2] == {}

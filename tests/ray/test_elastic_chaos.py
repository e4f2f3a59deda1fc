"""A bounded chaos run: random node kills and joins while the controller actor trains.

The controller runs as its named Ray actor with the real planner and a checkpoint directory
(every 3 steps). A seeded random schedule SIGKILLs pool nodes (always leaving one) and adds new
ones at random steps. The run must finish; a recovery may go back only to the latest checkpoint
(never more than the checkpoint interval); and every committed step survives exactly once: the
final checkpoint equals uninterrupted single-process training on the same data order.
"""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path

import pytest
from elastic_helpers import (
    add_pool_node,
    elastic_spec,
    max_relative_error,
    reference,
    remove_pool,
    tiny_job_spec,
)

from orchestrator.runtime.elastic.checkpoints import DirCheckpointStore
from orchestrator.runtime.elastic.controller_actor import RunHandle
from orchestrator.runtime.elastic.updates import StepDone
from orchestrator.runtime.local_nodes import crash_node

STEPS = 16
INTERVAL = 3
SEED = 20240607


@pytest.mark.slow
def test_random_kills_and_joins_keep_every_committed_step(ray_cluster, tmp_path: Path) -> None:
    pool = "chaos"
    nodes = [add_pool_node(ray_cluster, pool) for _ in range(3)]
    job = tiny_job_spec(
        "elastic-chaos",
        STEPS,
        checkpoint={"dir": str(tmp_path / "ckpt"), "interval_steps": INTERVAL},
        elasticity={"switch_threshold": 0.0, "max_failures": 10, "initial_backoff_s": 0.0},
    )
    rng = random.Random(SEED)
    # Three events at distinct steps in 2..12, each a kill or a join.
    schedule = {s: rng.choice(["kill", "join"]) for s in sorted(rng.sample(range(2, 13), 3))}
    alive = list(nodes)
    added = []
    handle = RunHandle.start(elastic_spec(job, pool))
    steps_seen = 0
    deadline = time.monotonic() + 420.0
    try:
        while True:
            ready = handle.wait(0.3)
            steps_seen += sum(1 for u in handle.updates() if isinstance(u, StepDone))
            for at in [s for s in schedule if steps_seen >= s]:
                if schedule.pop(at) == "kill" and len(alive) > 1:
                    victim = alive.pop(rng.randrange(len(alive)))
                    crash_node(ray_cluster, victim)
                else:
                    node = add_pool_node(ray_cluster, pool)
                    alive.append(node)
                    added.append(node)
            if ready:
                break
            assert time.monotonic() < deadline, "chaos run did not finish in time"
        summary = handle.result()
    finally:
        handle.stop()
        remove_pool(ray_cluster, nodes + added)

    assert summary.finished, summary.reason
    assert summary.steps == STEPS and summary.checkpoint_step == STEPS
    indices = summary.step_indices
    for before, after in itertools.pairwise(indices):
        # Forward by one, or back to a checkpoint at most one interval behind.
        assert after == before + 1 or before + 1 - INTERVAL <= after <= before, indices
    assert all(r.lost_steps <= INTERVAL for r in summary.recoveries), summary.recoveries
    final = DirCheckpointStore(tmp_path / "ckpt").load(STEPS)
    _, want_params = reference(job, STEPS)
    assert max_relative_error(final, want_params) < 1e-4

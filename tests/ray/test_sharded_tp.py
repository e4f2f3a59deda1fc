"""Tensor-parallel stages and sharded data parallel on the Ray runtime, against single-process fp32.

One plan mixes a pipeline whose second stage is tensor-parallel (tp 2, two actors) with a shard
group of two whole-model replicas that split their optimizer state, beside nothing else: five
actors on the shared test cluster, gloo between them. Parameters (fetched whole: the tp slices
and the optimizer slices are joined at the edge) must match the reference within 1e-5 relative.

The elastic test then re-plans that run in place: to tp 1 and unsharded through replica restore
(the survivors export their slices, the receivers join them), back to tp 2 and sharded, and to
tp 1 again from a checkpoint written in the layer-indexed whole-state format by the holders
themselves (the tp pair's and the shard group's parts joined by their writers); after every change
the run continues where it was and still equals uninterrupted single-process training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from elastic_helpers import max_relative_error
from ray_plans import GLOBAL_BATCH, NUM_PLANNER_LAYERS, tiny_job

from orchestrator.runtime.elastic.checkpoints import DirCheckpointStore
from orchestrator.runtime.elastic.group_port import write_by_holders
from orchestrator.runtime.elastic.restore import launch_group
from orchestrator.runtime.elastic.survivors import ElasticWorkerGroup
from orchestrator.runtime.group import WorkerGroup
from orchestrator.spec.plan import Plan
from orchestrator.worker.data import DataConfig
from orchestrator.worker.reference import ReferenceTrainer
from orchestrator.worker.topology import layer_copies

RTOL = 1e-5
A100, L4 = "A100-80", "L4"


def _plan(replicas: list[tuple[int, list[dict[str, Any]]]]) -> Plan:
    return Plan.model_validate(
        {
            "global_batch_size": sum(b for b, _ in replicas),
            "microbatch_size": 2,
            "replicas": [{"batch_size": b, "stages": stages} for b, stages in replicas],
        }
    )


# A pipeline 0-2 | 2-6 at tp 2, and two whole-model replicas sharding their optimizer state.
TP_AND_SHARDED = _plan(
    [
        (
            4,
            [
                {"layers": [0, 2], "device_type": A100},
                {"layers": [2, 6], "device_type": A100, "tp": 2},
            ],
        ),
        (3, [{"layers": [0, 6], "device_type": L4, "sharding": "optimizer"}]),
        (1, [{"layers": [0, 6], "device_type": L4, "sharding": "optimizer"}]),
    ]
)
# tp 1 and unsharded, cut elsewhere: every layer changes form.
PLAIN = _plan(
    [
        (5, [{"layers": [0, 3], "device_type": A100}, {"layers": [3, 6], "device_type": A100}]),
        (3, [{"layers": [0, 6], "device_type": L4}]),
    ]
)


def reference(steps: int) -> list[dict[int, dict[str, torch.Tensor]]]:
    """The reference's parameters after 0, 1, ..., ``steps`` steps."""
    job = tiny_job()
    ref = ReferenceTrainer(
        job.model_factory,
        job.model_kwargs,
        DataConfig(**job.data),
        GLOBAL_BATCH,
        optimizer=job.optimizer,
        learning_rate=job.learning_rate,
        seed=job.seed,
    )
    out = [ref.layer_params()]
    for k in range(steps):
        ref.train_step(k)
        out.append(ref.layer_params())
    return out


def assert_matches(
    states: dict[int, Any], want: dict[int, dict[str, torch.Tensor]], what: str
) -> None:
    assert sorted(states) == list(range(NUM_PLANNER_LAYERS)), what
    err = max_relative_error(states, want)
    print(f"{what}: worst relative error {err:.2e}")
    assert err <= RTOL, f"{what}: relative error {err:.2e} > {RTOL}"


@pytest.mark.slow
def test_tp_and_sharded_plan_matches_single_process(ray_cluster: object) -> None:
    group = WorkerGroup(tiny_job())
    try:
        workers = group.launch(TP_AND_SHARDED)
        assert len(workers) == 5  # one actor per tp position
        losses = [group.step().loss for _ in range(3)]
        states = group.fetch_layer_states()
    finally:
        group.stop()
    want = reference(3)
    assert losses[-1] < losses[0]
    assert max_relative_error(states, want[0]) > 1e-3  # the parameters did move
    assert_matches(states, want[3], "tp-2 stage + sharded group, 3 steps")


@pytest.mark.slow
def test_replan_between_tp_sharded_and_plain_through_replicas_and_checkpoint(
    ray_cluster: object, tmp_path: Path
) -> None:
    want = reference(6)
    store = DirCheckpointStore(tmp_path / "ckpt")
    group = ElasticWorkerGroup(tiny_job())
    try:
        group.launch(TP_AND_SHARDED)
        for _ in range(2):
            group.step()
        # A checkpoint of the tp-2 / sharded run, in the whole per-layer format, written by the
        # holders: even layers by the shard group (its slices joined by rank 3), odd ones by
        # the pipeline (layer 1 whole by rank 0, layers 3 and 5 joined from the tp pair).
        copies = layer_copies(TP_AND_SHARDED)
        chosen = {i: c[-1] if i % 2 == 0 else c[0] for i, c in copies.items()}
        assert {chosen[0], chosen[1], chosen[3]} == {(3, 4), (0,), (1, 2)}
        staging = store.begin(2)
        written = write_by_holders(group, staging, chosen, committed_steps=2, timeout_s=120.0)
        store.commit(2, staging, written, {"plan": TP_AND_SHARDED.model_dump(mode="json")})
        assert_matches(store.load(2), want[2], "checkpoint written by the tp and shard holders")

        # tp 2 -> tp 1, sharded -> unsharded, from the survivors' slices.
        report = group.reform(PLAIN, dead_ranks=set(), committed_steps=2, start_step=2)
        # Only the tp-1 first stage's layers 0-1 stay in place; the tp slices and the shard
        # group's slices are exported and joined by their new owners.
        assert report.layers_kept == 2 and report.bytes_moved > 0, report.line()
        for _ in range(2):
            group.step()
        assert_matches(group.fetch_layer_states(), want[4], "tp 2 -> tp 1 via replicas")

        # And back: tp 1 -> tp 2 and sharded.
        group.reform(TP_AND_SHARDED, dead_ranks=set(), committed_steps=4, start_step=4)
        group.step()
        assert_matches(group.fetch_layer_states(), want[5], "tp 1 -> tp 2 via replicas")

        # tp 2 -> tp 1 from the checkpoint at step 2 (the steps after it are thrown away), each
        # rank reading its own layers' files (the reference the controller resolves).
        group.reform(
            PLAIN,
            dead_ranks=set(),
            committed_steps=5,
            start_step=2,
            checkpoint_states=store.layer_files(2),
            keep_state=False,
        )
        for _ in range(2):
            group.step()
        assert_matches(group.fetch_layer_states(), want[4], "tp 2 -> tp 1 via checkpoint")

        # And tp 1 -> tp 2 and sharded from the same files: each rank cuts its part itself.
        group.reform(
            TP_AND_SHARDED,
            dead_ranks=set(),
            committed_steps=4,
            start_step=2,
            checkpoint_states=store.layer_files(2),
            keep_state=False,
        )
        group.step()
        assert_matches(group.fetch_layer_states(), want[3], "tp 1 -> tp 2 via checkpoint")
    finally:
        group.stop()

    # A fresh group (a restarted driver) from the same files: launched without states, each
    # tp-1 rank reads its own layers, the tp stage's first rank reads the stage's once.
    fresh = ElasticWorkerGroup(tiny_job())
    try:
        launch_group(fresh, TP_AND_SHARDED, store.layer_files(2), 2)
        fresh.step()
        assert_matches(fresh.fetch_layer_states(), want[3], "fresh tp 2 / sharded via checkpoint")
    finally:
        fresh.stop()


# Three whole-model replicas with parameters, gradients and optimizer state sharded (ZeRO-3),
# uneven batch shares 4:3:1.
FULLY_SHARDED = _plan(
    [
        (4, [{"layers": [0, 6], "device_type": A100, "sharding": "full"}]),
        (3, [{"layers": [0, 6], "device_type": L4, "sharding": "full"}]),
        (1, [{"layers": [0, 6], "device_type": L4, "sharding": "full"}]),
    ]
)


@pytest.mark.slow
def test_fully_sharded_run_replans_to_unsharded_through_replicas(ray_cluster: object) -> None:
    """A fully sharded group's parameters live only in its slices between steps: fetched and
    re-planned states are joined from them, and the unsharded plan continues the same run."""
    want = reference(3)
    group = ElasticWorkerGroup(tiny_job())
    try:
        group.launch(FULLY_SHARDED)
        for _ in range(2):
            group.step()
        assert_matches(group.fetch_layer_states(), want[2], "fully sharded over 3, 2 steps")
        report = group.reform(PLAIN, dead_ranks=set(), committed_steps=2, start_step=2)
        # no layer is held whole by one rank under full sharding: every one is joined and moved
        assert report.layers_kept == 0 and report.bytes_moved > 0, report.line()
        group.step()
        assert_matches(group.fetch_layer_states(), want[3], "full -> unsharded via replicas")
    finally:
        group.stop()

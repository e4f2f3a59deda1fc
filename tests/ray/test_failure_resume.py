"""Failures surface as typed errors naming what was lost; states move between different plans.

- A killed worker makes the next step raise ``WorkerLost`` (a ``TransientError``) naming its
  rank and node, and the group still stops cleanly.
- Training resumed from a layer-indexed checkpoint under a plan with other stage boundaries and
  other device types continues exactly as single-process training would.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import torch
from elastic_helpers import joined_qkv
from ray_plans import A100, EXACTNESS_PLANS, GLOBAL_BATCH, L4, plan, tiny_job

from orchestrator.control.ports import WorkerLost
from orchestrator.errors import TransientError
from orchestrator.runtime.group import GroupOptions, WorkerGroup
from orchestrator.worker.checkpoint import load_latest, save_checkpoint
from orchestrator.worker.data import DataConfig
from orchestrator.worker.reference import ReferenceTrainer


def test_killed_worker_is_reported_by_rank_and_node(ray_cluster: object) -> None:
    group = WorkerGroup(tiny_job(), GroupOptions(failure_grace_s=5.0, stop_timeout_s=5.0))
    try:
        workers = group.launch(EXACTNESS_PLANS["1x3-uneven"])
        group.step()
        ray.kill(group._actors[1], no_restart=True)
        with pytest.raises(WorkerLost) as info:
            group.step()
    finally:
        group.stop()
    err = info.value
    assert isinstance(err, TransientError)
    assert err.ranks == (1,)
    assert err.nodes == (workers[1].node_id,)
    assert f"lost ranks [1] on nodes ['{workers[1].node_id}']" in str(err)


def test_resume_under_another_plan_matches_single_process(
    ray_cluster: object, tmp_path: Path
) -> None:
    job = tiny_job()
    first = EXACTNESS_PLANS["1x3-uneven"]
    second = plan((3, [(0, 4, L4), (4, 6, A100)]), (5, [(0, 1, A100), (1, 6, L4)]))
    group = WorkerGroup(job)
    try:
        group.launch(first)
        group.step()
        group.step()
        save_checkpoint(tmp_path, 2, group.fetch_layer_states(), first)
    finally:
        group.stop()
    found = load_latest(tmp_path)
    assert found is not None and found.step == 2 and found.plan == first
    group = WorkerGroup(job)
    try:
        group.launch(second, found.layer_states, start_step=found.step)
        loss = group.step().loss
        states = group.fetch_layer_states()
    finally:
        group.stop()
    ref = ReferenceTrainer(
        job.model_factory,
        job.model_kwargs,
        DataConfig(**job.data),
        GLOBAL_BATCH,
        optimizer=job.optimizer,
        learning_rate=job.learning_rate,
        seed=job.seed,
    )
    want_losses = [ref.train_step(k) for k in range(3)]
    assert abs(loss - want_losses[2]) <= 1e-5 * want_losses[2]
    for layer, params in ref.layer_params().items():
        got_params = joined_qkv(states[layer]["params"])  # the key bias alone is rounding noise
        for name, want in joined_qkv(params).items():
            got = got_params[name]
            err = float((got - want).norm() / want.norm().clamp_min(1e-12))
            assert err <= 1e-5, f"layer {layer} {name}: {err:.2e}"
    assert isinstance(states[0]["params"]["tokens.weight"], torch.Tensor)

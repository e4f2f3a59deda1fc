"""Helpers of the elastic tests: a pool of labelled nodes on the shared cluster, the tiny job,
a replica-per-device planner, a driver that acts at given steps, and the single-process reference.

Each test adds its own pool of nodes to the session's cluster (``tests/ray/conftest.py``), labelled
``orchestrator.io/pool=<name>``, and the controller's probe selects that pool only, so tests never
plan on each other's nodes. Pool nodes carry a low emulated speed (steps of a few tenths of a
second) so that Ray's view of a join or a drain arrives while training still runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from ray_plans import GLOBAL_BATCH, MODEL_KWARGS, NUM_PLANNER_LAYERS

from orchestrator.control.ports import PlanProposal
from orchestrator.errors import InfeasibleError
from orchestrator.runtime.elastic.session import ElasticJob, Session
from orchestrator.runtime.jobs import worker_job
from orchestrator.spec.job import JobSpec
from orchestrator.spec.labels import POOL_LABEL
from orchestrator.spec.plan import Plan, ReplicaSpec, StageSpec
from orchestrator.spec.snapshot import ClusterSnapshot
from orchestrator.worker.data import DataConfig
from orchestrator.worker.reference import ReferenceTrainer

# Far below the session cluster's fastest emulated speed (1.0): pool workers run ~20x stretched.
POOL_SPEED = "0.05"


def pool_labels(pool: str, device_type: str = "T4") -> dict[str, str]:
    return {
        "orchestrator.io/device-type": device_type,
        "orchestrator.io/emulated-speed": POOL_SPEED,
        POOL_LABEL: pool,
    }


def add_pool_node(cluster: Any, pool: str, device_type: str = "T4") -> Any:
    """One node of one fake GPU in ``pool``; returns Ray's node handle (``.node_id``)."""
    return cluster.add_node(num_cpus=1, num_gpus=1, labels=pool_labels(pool, device_type))


def remove_pool(cluster: Any, nodes: list[Any]) -> None:
    """Remove the nodes a test added that are still there (a killed one is skipped)."""
    alive = {n.node_id for n in cluster.worker_nodes}
    for node in nodes:
        if node.node_id in alive:
            cluster.remove_node(node, allow_graceful=False)


def tiny_job_spec(name: str, steps: int, **extra: Any) -> JobSpec:
    """The Ray tests' 4-block GPT (6 planner layers), SGD, seed 7, as a job spec."""
    raw: dict[str, Any] = {
        "name": name,
        "model": {
            "factory": "orchestrator.models.gpt:make_gpt",
            "shape": {"name": "gpt-test", "vocab_size": 256, "dtype": "fp32", **MODEL_KWARGS},
        },
        "data": {},
        "training": {
            "global_batch_size": GLOBAL_BATCH,
            "microbatch_sizes": [2],
            "steps": steps,
            "optimizer": "sgd",
            "learning_rate": 0.05,
            "seed": 7,
        },
        "metrics": {"port": None},
        "elasticity": {"initial_backoff_s": 0.0, "poll_interval_s": 0.3},
    }
    for key, value in extra.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return JobSpec.model_validate(raw)


def elastic_spec(job: JobSpec, pool: str, job_file: str = "/tmp/elastic-test.yaml") -> ElasticJob:
    return ElasticJob.from_spec(job, job_file, node_selector={POOL_LABEL: pool})


class ReplicaPerDevice:
    """A planner that gives every device a whole-model replica (batch split evenly), pinned to
    its node; predicted step time falls with the device count.

    Deliberately simple, so the recovery tests know that every layer is replicated; the real
    planner's choices are exercised by the chaos test and ``orchestrator run``.
    """

    def __call__(
        self, snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]
    ) -> PlanProposal:
        devices = [(n.node_id, n.device_type) for n in snapshot.nodes for _ in range(n.num_devices)]
        devices = devices[:GLOBAL_BATCH]
        if not devices:
            raise InfeasibleError("no device", field="cluster")
        share, extra = divmod(GLOBAL_BATCH, len(devices))
        replicas = tuple(
            ReplicaSpec(
                batch_size=share + (1 if i < extra else 0),
                stages=(StageSpec(layers=(0, NUM_PLANNER_LAYERS), device_type=t, node=node),),
            )
            for i, (node, t) in enumerate(devices)
        )
        plan = Plan(global_batch_size=GLOBAL_BATCH, microbatch_size=1, replicas=replicas)
        step_s = 0.5 * GLOBAL_BATCH / len(devices)
        return PlanProposal(plan, predicted_step_s=step_s, bound_step_s=step_s / 2)


def drive(
    session: Session, actions: Mapping[int, Callable[[], None]], limit_s: float = 300.0
) -> None:
    """Step the controller to the end, calling ``actions[k]`` (in this, the main thread) once
    ``k`` steps are committed."""
    c = session.controller
    pending = dict(sorted(actions.items()))
    started = time.monotonic()
    while not c.done:
        c.step()
        for at in [k for k in pending if c.next_step >= k]:
            pending.pop(at)()
        assert time.monotonic() - started < limit_s, f"run not done after {limit_s:.0f} s"


def reference(job: JobSpec, steps: int) -> tuple[list[float], dict[int, dict[str, torch.Tensor]]]:
    """Losses and final parameters of uninterrupted single-process training (same data order)."""
    wjob = worker_job(job, "/tmp/elastic-test.yaml")
    ref = ReferenceTrainer(
        wjob.model_factory,
        wjob.model_kwargs,
        DataConfig(**wjob.data),
        GLOBAL_BATCH,
        optimizer=wjob.optimizer,
        learning_rate=wjob.learning_rate,
        seed=wjob.seed,
    )
    losses = [ref.train_step(k) for k in range(steps)]
    return losses, ref.layer_params()


def joined_qkv(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``params`` with the query, key and value projections joined into one tensor each.

    The key bias alone has a zero gradient in exact arithmetic (softmax is invariant to adding
    the same score to every key), so its values are rounding noise with no scale of their own;
    compared together with q and v it is measured against the projection's scale.
    """
    out: dict[str, torch.Tensor] = {}
    for name, value in params.items():
        prefix, _, suffix = name.partition(".")
        names = [f"{x}.{suffix}" for x in "qkv"]
        if prefix in ("q", "k", "v") and all(n in params for n in names):
            out[f"qkv.{suffix}"] = torch.cat([params[n].reshape(-1) for n in names])
        else:
            out[name] = value
    return out


def max_relative_error(
    states: Mapping[int, Any], want: Mapping[int, Mapping[str, torch.Tensor]]
) -> float:
    """Largest ||got - want|| / ||want|| over every parameter of every layer (q, k, v joined)."""
    worst = 0.0
    for layer, params in want.items():
        got_params = joined_qkv(states[layer]["params"])
        for name, expected in joined_qkv(params).items():
            got = got_params[name]
            err = float((got - expected).norm() / expected.norm().clamp_min(1e-12))
            worst = max(worst, err)
    return worst


def drain(cluster: Any, node_id: str, deadline_s: float) -> None:
    """A preemption notice for ``node_id`` with a wall-clock deadline (Ray's drain API)."""
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    gcs = GcsClient(address=cluster.gcs_address)
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    accepted, why = gcs.drain_node(node_id, reason, "test preemption", int(deadline_s * 1000))
    assert accepted, f"drain refused: {why}"

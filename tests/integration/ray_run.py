"""A real elastic training run on a local multi-node Ray cluster, with one node crashed mid-run.

Everything here is the product's own path: the controller with its Ray ports
(``orchestrator.runtime.elastic.session.build_session``: the cluster probe over ``ray.nodes()``,
Ray actor worker groups training the example GPT with torch.distributed/gloo, a checkpoint
directory, the real planner). The cluster is ``ray.cluster_utils.Cluster`` on this machine: two
``A100-40`` nodes and two ``V100-16`` nodes whose speed is emulated (every output says so). The
caller's callbacks (the Prometheus exporter) see every controller hook.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.runtime.elastic.session import ElasticJob, build_session
from orchestrator.runtime.local_nodes import FAST_HEALTH_CHECKS, crash_node
from orchestrator.spec.job import JobSpec

FAST = {"orchestrator.io/device-type": "A100-40", "orchestrator.io/emulated-speed": "1.0"}
SLOW = {"orchestrator.io/device-type": "V100-16", "orchestrator.io/emulated-speed": "0.5"}


@dataclass(frozen=True)
class RunSummary:
    state: str
    steps: int
    failures: int
    lost_steps: int


def _token_file(workdir: Path) -> Path:
    """A learnable token file (a repeating ramp of ids below the vocabulary) with a held-out
    split, so the run also reports a validation loss."""
    import numpy as np

    path = workdir / "tokens.bin"
    np.tile(np.arange(256, dtype=np.uint16), 80).tofile(path)
    return path


def _job(workdir: Path, steps: int, interval: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "it-ray",
            "model": {
                "factory": "orchestrator.models.gpt:make_gpt",
                "shape": {
                    "name": "gpt-it",
                    "num_layers": 4,
                    "hidden_size": 32,
                    "num_heads": 2,
                    "sequence_length": 16,
                    "vocab_size": 256,
                    "dtype": "fp32",
                },
            },
            "data": {
                "tokens": str(_token_file(workdir)),
                "dtype": "uint16",
                "validation_fraction": 0.1,
            },
            "training": {
                "eval_every": 4,
                "eval_batches": 1,
                "global_batch_size": 16,
                "microbatch_sizes": [2],
                "steps": steps,
                "optimizer": "sgd",
                "learning_rate": 0.05,
                "seed": 7,
            },
            "checkpoint": {"dir": str(workdir / "checkpoints"), "interval_steps": interval},
            "metrics": {"port": None},
            "elasticity": {"initial_backoff_s": 0.0, "poll_interval_s": 0.3},
        }
    )


def _busiest_node(nodes: dict[str, Any], placement: Mapping[int, str]) -> str | None:
    """The name of a node hosting workers of the current plan (the last by name), if any."""
    used = set(placement.values())
    hosting = sorted(name for name, node in nodes.items() if node.node_id in used)
    return hosting[-1] if hosting else None


def _train_with_one_crash(
    session: Any, cluster: Any, nodes: dict[str, Any], crash_after_step: int, limit_s: float
) -> None:
    """Step the controller to the end; crash a node hosting workers once ``crash_after_step``
    steps are committed."""
    controller = session.controller
    crashed = False
    started = time.monotonic()
    while not controller.done:
        controller.step()
        if not crashed and controller.next_step >= crash_after_step:
            victim = _busiest_node(nodes, session.workers.placement())
            if victim is not None:
                crash_node(cluster, nodes.pop(victim))
                crashed = True
        if time.monotonic() - started > limit_s:
            raise AssertionError(f"run not done after {limit_s:.0f} s")


def run_elastic_on_ray(
    callbacks: Sequence[ControllerCallback],
    workdir: Path,
    *,
    total_steps: int = 24,
    crash_after_step: int = 10,
    checkpoint_interval_steps: int = 5,
    limit_s: float = 400.0,
) -> RunSummary:
    """Train to the end on a fresh local Ray cluster; SIGKILL one node that hosts workers (a
    node the current plan uses, so the crash is a real failure of the run)."""
    os.environ.update(FAST_HEALTH_CHECKS)
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    nodes: dict[str, Any] = {}
    try:
        for name, labels in (
            ("fast-0", FAST),
            ("fast-1", FAST),
            ("slow-0", SLOW),
            ("slow-1", SLOW),
        ):
            nodes[name] = cluster.add_node(num_cpus=1, num_gpus=1, labels=labels)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        job = _job(workdir, total_steps, checkpoint_interval_steps)
        job_file = workdir / "job.yaml"
        spec = ElasticJob.from_spec(job, job_file)
        session = build_session(spec, serve=False, extra_callbacks=callbacks)
        try:
            _train_with_one_crash(session, cluster, nodes, crash_after_step, limit_s)
        finally:
            session.workers.stop()
        controller = session.controller
        return RunSummary(
            str(controller.state.name),
            controller.next_step,
            controller.failure_count,
            controller.lost_steps_total,
        )
    finally:
        ray.shutdown()
        cluster.shutdown()

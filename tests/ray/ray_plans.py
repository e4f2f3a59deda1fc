"""Plans and a job the Ray tests share: a 4-block GPT (6 planner layers) on the test cluster."""

from __future__ import annotations

from typing import Any

from orchestrator.runtime.actor import WorkerJob
from orchestrator.spec.plan import Plan

MODEL_KWARGS = {"num_layers": 4, "hidden_size": 32, "num_heads": 2, "sequence_length": 16}
NUM_PLANNER_LAYERS = 6
GLOBAL_BATCH = 8


def tiny_job(
    schedule: str = "1f1b", optimizer: str = "sgd", learning_rate: float = 0.05
) -> WorkerJob:
    return WorkerJob(
        model_factory="orchestrator.models.gpt:make_gpt",
        model_kwargs=dict(MODEL_KWARGS),
        data={"sequence_length": MODEL_KWARGS["sequence_length"]},
        schedule=schedule,
        optimizer=optimizer,
        learning_rate=learning_rate,
        seed=7,
    )


def plan(*replicas: tuple[int, list[tuple[int, int, str]]], microbatch: int = 2) -> Plan:
    """``plan((batch, [(start, end, device_type), ...]), ...)``."""
    raw: dict[str, Any] = {
        "global_batch_size": sum(b for b, _ in replicas),
        "microbatch_size": microbatch,
        "replicas": [
            {"batch_size": b, "stages": [{"layers": [s, e], "device_type": t} for s, e, t in st]}
            for b, st in replicas
        ],
    }
    return Plan.model_validate(raw)


A100, L4 = "A100-80", "L4"

EXACTNESS_PLANS = {
    # one replica, three uneven stages: 1 + 3 + 2 layers
    "1x3-uneven": plan((8, [(0, 1, A100), (1, 4, A100), (4, 6, A100)])),
    # three replicas sharing the batch 5:2:1, one stage each
    "3-replicas-5:2:1": plan((5, [(0, 6, A100)]), (2, [(0, 6, A100)]), (1, [(0, 6, L4)])),
    # two replicas cutting the model at different layers (2 vs 4)
    "2-replicas-different-cuts": plan(
        (5, [(0, 2, A100), (2, 6, A100)]), (3, [(0, 4, A100), (4, 6, A100)])
    ),
    # a replica mixing device types, beside a one-stage replica of the slow type
    "mixed-device-types": plan((6, [(0, 3, A100), (3, 6, L4)]), (2, [(0, 6, L4)])),
}

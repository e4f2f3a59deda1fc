"""Any plan computes the same update as single-process fp32 training, through the real WorkerGroup.

Each case launches one Ray actor per stage on the shared multi-node cluster (gloo between them),
trains a few steps, fetches every layer's parameters from the workers and compares them with
:class:`~orchestrator.worker.reference.ReferenceTrainer` on the same data: within 1e-5 relative
(per tensor, in the L2 norm), and the step losses likewise.

The optimizer is SGD with momentum: its update is linear in the gradients, so the comparison sees
only the rounding of sums taken in another order. Adam divides by the gradient's own magnitude and
turns that rounding into full-size steps wherever the true gradient is zero (the attention key
bias, whose gradient vanishes identically), which no tolerance on the parameters can absorb.
"""

from __future__ import annotations

import pytest
import torch
from elastic_helpers import joined_qkv
from ray_plans import EXACTNESS_PLANS, GLOBAL_BATCH, NUM_PLANNER_LAYERS, tiny_job

from orchestrator.runtime.group import WorkerGroup
from orchestrator.worker.data import DataConfig
from orchestrator.worker.reference import ReferenceTrainer

STEPS = 3
RTOL = 1e-5


def reference_run(schedule: str) -> tuple[list[float], dict[int, dict[str, torch.Tensor]]]:
    job = tiny_job(schedule)
    ref = ReferenceTrainer(
        job.model_factory,
        job.model_kwargs,
        DataConfig(**job.data),
        GLOBAL_BATCH,
        optimizer=job.optimizer,
        learning_rate=job.learning_rate,
        seed=job.seed,
    )
    losses = [ref.train_step(k) for k in range(STEPS)]
    return losses, ref.layer_params()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm().clamp_min(1e-12))


@pytest.mark.parametrize(
    ("case", "schedule"),
    [(name, "1f1b") for name in EXACTNESS_PLANS] + [("1x3-uneven", "gpipe")],
)
def test_plan_matches_single_process(ray_cluster: object, case: str, schedule: str) -> None:
    plan = EXACTNESS_PLANS[case]
    group = WorkerGroup(tiny_job(schedule))
    try:
        group.launch(plan)
        losses = [group.step().loss for _ in range(STEPS)]
        states = group.fetch_layer_states()
    finally:
        group.stop()
    want_losses, want_params = reference_run(schedule)
    for got, want in zip(losses, want_losses, strict=True):
        assert abs(got - want) <= RTOL * abs(want), (losses, want_losses)
    assert sorted(states) == list(range(NUM_PLANNER_LAYERS))
    worst = 0.0
    for layer, params in want_params.items():
        got_params = joined_qkv(states[layer]["params"])  # the key bias alone is rounding noise
        for name, want in joined_qkv(params).items():
            err = relative_error(got_params[name], want)
            worst = max(worst, err)
            assert err <= RTOL, f"layer {layer} {name}: relative error {err:.2e} > {RTOL}"
    # The update is not trivially zero: parameters moved away from their initial values.
    assert losses[-1] < losses[0]
    print(f"{case} ({schedule}): worst relative error {worst:.2e}")

"""bf16 and fp16 plans train as single-process training in the same precision does.

Real gloo process groups, autocast on the CPU. The reference is ``ReferenceTrainer`` in the same
precision (autocast over fp32 parameters; for fp16, ``torch.amp.GradScaler`` itself).

Tolerance: per step, |loss - loss_ref| <= 1e-3 x loss_ref. A 16-bit run differs from its
single-process reference by the rounding of the stage-boundary tensors (sent in the compute
dtype) and of the microbatch split; measured 4e-5 (bf16) and 8e-6 (fp16) over 8 steps of the
tiny GPT, while a wrong loss scale or a missing unscale moves the loss by orders more.
"""

from __future__ import annotations

import pytest
import torch
from dist_cases import DATA, GPT_FACTORY, LEARNING_RATE, TINY_GPT, engine_config, make_plan

from orchestrator.worker.local import run_local
from orchestrator.worker.reference import ReferenceTrainer

LOSS_RTOL = 1e-3
PARAM_SHARE = 0.2  # per layer: ||theta - theta_ref|| <= 0.2 x ||theta_ref - theta_0||
NUM_STEPS = 4

# Two replicas cutting the model at different layers: 2 + 3 stages, 1F1B with 2 microbatches.
PLAN = make_plan(
    [
        (4, [((0, 1), "A100"), ((1, 5), "A100")]),
        (4, [((0, 3), "A100"), ((3, 4), "A100"), ((4, 5), "A100")]),
    ]
)


def _reference(precision: str, **kwargs: float) -> ReferenceTrainer:
    return ReferenceTrainer(
        GPT_FACTORY,
        dict(TINY_GPT),
        DATA,
        PLAN.global_batch_size,
        learning_rate=LEARNING_RATE,
        precision=precision,
        **kwargs,
    )


def _global_losses(results: dict[int, list]) -> list[float]:  # type: ignore[type-arg]
    return [
        sum(r[s].loss for r in results.values() if r[s].loss is not None) for s in range(NUM_STEPS)
    ]


@pytest.mark.slow
def test_bf16_plan_matches_single_process_bf16() -> None:
    run = run_local(engine_config(PLAN, precision="bf16"), range(NUM_STEPS))
    ref = _reference("bf16")
    ref_losses = [ref.train_step(s) for s in range(NUM_STEPS)]
    losses = _global_losses(run.results)
    for got, want in zip(losses, ref_losses, strict=True):
        assert abs(got - want) <= LOSS_RTOL * want, (losses, ref_losses)
    # The parameters stay fp32 masters.
    assert all(
        t.dtype == torch.float32 for s in run.layer_states.values() for t in s["params"].values()
    )
    # Per layer, the distance to the reference is a small part of how far training moved the
    # layer (Adam's per-element updates are sign-sensitive to rounding; see test_exactness).
    start = _reference("bf16").layer_params()
    ref_params = ref.layer_params()
    for layer, state in run.layer_states.items():
        keys = sorted(ref_params[layer])
        got = torch.cat([state["params"][k].reshape(-1) for k in keys])
        want = torch.cat([ref_params[layer][k].reshape(-1) for k in keys])
        moved = torch.cat([(ref_params[layer][k] - start[layer][k]).reshape(-1) for k in keys])
        assert float((got - want).norm()) <= PARAM_SHARE * float(moved.norm()), layer


@pytest.mark.slow
def test_fp16_plan_matches_single_process_gradscaler() -> None:
    run = run_local(engine_config(PLAN, precision="fp16"), range(NUM_STEPS))
    ref = _reference("fp16")
    ref_losses = [ref.train_step(s) for s in range(NUM_STEPS)]
    assert not any(ref.skipped), "the reference overflowed at the default scale"
    assert not any(r.overflow_skipped for results in run.results.values() for r in results)
    assert all(r.loss_scale == 2.0**16 for results in run.results.values() for r in results)
    losses = _global_losses(run.results)
    for got, want in zip(losses, ref_losses, strict=True):
        assert abs(got - want) <= LOSS_RTOL * want, (losses, ref_losses)


@pytest.mark.slow
def test_fp16_overflow_skips_the_step_on_every_rank() -> None:
    # Whether a borderline scale overflows depends on where the residual stream is 16-bit, which
    # stage boundaries change; 2^30 overflows in any layout (GradScaler agrees, checked below).
    init = 2.0**30
    steps = 3
    plan = make_plan([(8, [((0, 1), "A100"), ((1, 4), "A100"), ((4, 5), "A100")])], 4)
    run = run_local(engine_config(plan, precision="fp16", loss_scale_init=init), range(steps))
    ref = _reference("fp16", loss_scale_init=init)
    for s in range(steps):
        ref.train_step(s)
    assert all(ref.skipped), ref.skipped
    for results in run.results.values():
        assert [r.overflow_skipped for r in results] == [True] * steps
        # Halved after each overflow, as GradScaler's backoff does.
        assert [r.loss_scale for r in results] == [init / 2**k for k in range(steps)]
    # No rank applied any of the skipped updates: every parameter is still its initial value.
    initial = _reference("fp32").layer_params()
    for layer, state in run.layer_states.items():
        for k, want in initial[layer].items():
            assert torch.equal(state["params"][k], want), (layer, k)

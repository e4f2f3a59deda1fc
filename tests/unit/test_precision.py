"""The precision policy and the loss scaler (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from orchestrator.errors import SpecError
from orchestrator.worker.precision import (
    DynamicLossScaler,
    Precision,
    PrecisionPolicy,
    has_non_finite,
    parse_precision,
    unscale_,
)


def test_unknown_precision_names_the_field() -> None:
    with pytest.raises(SpecError) as err:
        parse_precision("fp8")
    assert err.value.field == "training.precision"


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_16_bit_compute_over_fp32_weights(precision: str, dtype: torch.dtype) -> None:
    policy = PrecisionPolicy(parse_precision(precision), "cpu")
    layer = torch.nn.Linear(8, 8)
    with policy.autocast():
        out = layer(torch.randn(2, 8))
    assert out.dtype == dtype
    assert layer.weight.dtype == torch.float32  # the master stays fp32
    assert policy.boundary_dtype(torch.float32) == dtype
    with policy.autocast(), policy.no_autocast():
        assert layer(torch.randn(2, 8)).dtype == torch.float32


def test_fp32_changes_nothing() -> None:
    policy = PrecisionPolicy(Precision.FP32, "cpu")
    with policy.autocast():
        assert torch.nn.Linear(4, 4)(torch.randn(1, 4)).dtype == torch.float32
    assert policy.boundary_dtype(torch.float32) == torch.float32
    assert not policy.scales_loss


def test_scaler_follows_gradscaler_on_the_same_overflow_sequence() -> None:
    overflows = [True, False, False, False, True, False, False, False, False, False]
    ours = DynamicLossScaler(scale=1024.0, growth_interval=3)
    theirs = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)
    for overflow in overflows:
        assert ours.scale == theirs.get_scale()
        theirs.scale(torch.ones(1))  # initialises GradScaler's scale tensor, as in training
        param.grad = torch.tensor([float("inf") if overflow else 1.0])
        theirs.step(opt)  # GradScaler needs a step to record the overflow
        theirs.update()
        ours.update(overflow)
    assert ours.scale == theirs.get_scale()


def test_overflow_check_and_unscale() -> None:
    grads: list[torch.Tensor | None] = [torch.ones(3), None, torch.full((2,), 8.0)]
    assert not has_non_finite(grads)
    unscale_(grads, 4.0)
    assert torch.equal(grads[2], torch.full((2,), 2.0))  # type: ignore[arg-type]
    assert has_non_finite([torch.tensor([1.0, float("nan")])])
    assert has_non_finite([torch.tensor([float("-inf")])])

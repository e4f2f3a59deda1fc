"""A non-finite step is never applied: it stops training naming the step, or is skipped."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from orchestrator.errors import NonFiniteStepError, PermanentError
from orchestrator.worker.finite import FiniteGuard

CPU = torch.device("cpu")


def _layers_with_grads(grad_value: float) -> dict[int, nn.Module]:
    torch.manual_seed(0)
    layers: dict[int, nn.Module] = {0: nn.Linear(3, 2), 1: nn.Linear(2, 1)}
    for layer in layers.values():
        for p in layer.parameters():
            p.grad = torch.full_like(p, 0.5)
    layers[1].bias.grad = torch.tensor([grad_value])  # type: ignore[union-attr]
    return layers


def test_finite_step_passes_and_keeps_gradients() -> None:
    layers = _layers_with_grads(0.25)
    assert FiniteGuard().check(4, 1.5, layers, CPU) is True
    assert all(p.grad is not None for layer in layers.values() for p in layer.parameters())


@pytest.mark.parametrize(
    ("loss", "grad", "what"),
    [
        (float("nan"), 0.1, "non-finite loss"),
        (float("inf"), 0.1, "non-finite loss"),
        (2.0, float("nan"), "non-finite gradient norm"),
        (None, float("-inf"), "non-finite gradient norm"),  # a stage without the loss
    ],
)
def test_non_finite_step_stops_naming_step_and_cause(
    loss: float | None, grad: float, what: str
) -> None:
    guard = FiniteGuard(learning_rate=3.0)
    with pytest.raises(NonFiniteStepError, match=f"step 7: {what}") as info:
        guard.check(7, loss, _layers_with_grads(grad), CPU)
    assert info.value.step == 7
    assert "learning rate (3) too high" in str(info.value)
    assert "skip_nonfinite_steps" in str(info.value)
    assert isinstance(info.value, PermanentError)  # never retried as a transient failure
    # crosses a Ray actor boundary intact
    again = pickle.loads(pickle.dumps(info.value))
    assert again.step == 7 and str(again) == str(info.value)


def test_skipped_step_leaves_weights_and_optimizer_state_untouched() -> None:
    layers = _layers_with_grads(0.25)
    params = [p for layer in layers.values() for p in layer.parameters()]
    opt = torch.optim.Adam(params, lr=0.1)
    opt.step()  # one good step: the optimizer has state
    before = [p.detach().clone() for p in params]
    state_before = pickle.dumps(opt.state_dict())
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    guard = FiniteGuard(max_skips=1)
    assert guard.check(3, 1.0, layers, CPU) is False
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, params, strict=True))
    assert pickle.dumps(opt.state_dict()) == state_before
    assert guard.skipped_steps == [3]
    # the budget is spent: the next bad step stops training, saying the budget is used up
    for p in params:
        p.grad = torch.full_like(p, float("inf"))
    with pytest.raises(NonFiniteStepError, match=r"step 9: .*1 such step\(s\) already skipped"):
        guard.check(9, 1.0, layers, CPU)

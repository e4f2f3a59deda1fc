"""Emulated layer times are scaled to the whole model as one stretched stage call
(``worker/in_context.py``): a cost that arises only when layers run as a chain is in the profile."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from orchestrator.worker.in_context import measure_in_context

BURN_S = 0.004  # CPU a layer burns when the layer before it ran just before (a chain)


class _ChainCostLayer(nn.Module):
    """A linear layer that costs ``BURN_S`` more CPU when its input comes from another layer."""

    last_called = -1

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _ChainCostLayer.last_called == self.index - 1:
            end = time.thread_time() + BURN_S
            while time.thread_time() < end:
                pass
        _ChainCostLayer.last_called = self.index
        return self.linear(x)


class _Model:
    def loss(self, out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ((out - targets) ** 2).mean()


def _alone_cpu_s(layer: nn.Module, x: torch.Tensor, repeats: int = 9) -> float:
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        layer(x)
        times.append(time.thread_time() - start)
    return min(times)


def test_a_cost_only_chains_pay_is_in_the_ratio() -> None:
    torch.manual_seed(0)
    layers = {i: _ChainCostLayer(i) for i in range(4)}
    x, targets = torch.randn(4, 8), torch.randn(4, 8)
    alone = [_alone_cpu_s(layer, x) for layer in layers.values()]  # each repeated: no chain cost
    backward_alone = [max(a, 1e-5) for a in alone]
    _ChainCostLayer.last_called = -1
    ratio = measure_in_context(
        _Model(),
        layers,
        x,
        targets,
        2.0,
        alone,
        backward_alone,
        repeats=5,  # type: ignore[arg-type]
    )
    # Layers 1-3 burn BURN_S each in the chain (layer 0 follows the previous run's layer 3).
    assert ratio.forward_cpu_s >= 3 * BURN_S
    assert ratio.forward == pytest.approx(ratio.forward_cpu_s / sum(alone))
    assert ratio.forward > 3 * BURN_S / sum(alone) > 1.0
    assert ratio.backward > 0


def test_real_speed_is_refused() -> None:
    layers = {0: nn.Linear(2, 2)}
    with pytest.raises(ValueError, match="emulated"):
        measure_in_context(
            _Model(),
            layers,
            torch.ones(1, 2),
            torch.ones(1, 2),
            1.0,
            [1.0],
            [1.0],  # type: ignore[arg-type]
        )

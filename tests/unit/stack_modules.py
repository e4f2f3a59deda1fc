"""Small stack modules for the per-stage build tests: one safe to build on meta, several not."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Scale(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.empty(width))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.gain, 0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


class Stack(nn.Module):
    def __init__(
        self, block: type[nn.Module] | None = None, width: int = 8, depth: int = 3
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, width)
        make = block or (lambda w: nn.Sequential(nn.Linear(w, w), Scale(w), nn.GELU()))
        self.blocks = nn.ModuleList(make(width) for _ in range(depth))
        self.head = nn.Linear(width, 32)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class EagerRandn(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(width, width) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


class BufferInInit(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.register_buffer("freq", 1.0 / (10.0 ** (torch.arange(width) / width)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.freq


class NoReset(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


class InitLoop(nn.Module):
    """GPT-style: construct, then re-initialise every Linear in __init__."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def safe() -> Stack:
    return Stack()


def eager_randn() -> Stack:
    return Stack(EagerRandn)


def buffer_in_init() -> Stack:
    return Stack(BufferInInit)


def no_reset() -> Stack:
    return Stack(NoReset)


def init_loop() -> Stack:
    return Stack(InitLoop)

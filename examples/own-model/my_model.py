"""A model of your own: a stack of blocks the orchestrator cuts into pipeline stages.

Any ``nn.Module`` with ``embed``, ``blocks`` (an ``nn.ModuleList``), ``head`` and
``loss(logits, targets)`` works; ``job.yaml`` names ``build`` by import path (this file travels
with ``ray job submit --working-dir .``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MixerBlock(nn.Module):
    """Causal token mixing by a learned lower-triangular matrix, then a gated MLP.

    Its own parameter is initialised in ``reset_parameters`` (as torch's layers do), so each
    worker can build only its stage's blocks (docs/models.md).
    """

    def __init__(self, width: int, length: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.mix = nn.Parameter(torch.empty(length, length))
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.gate = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.mix, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        mix = torch.tril(self.mix[:length, :length])
        x = x + mix @ self.norm1(x)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TokenMixer(nn.Module):
    def __init__(self, width: int = 64, depth: int = 4, length: int = 32, vocab: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(MixerBlock(width, length) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, vocab))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # type: ignore[no-any-return]

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build(width: int = 64, depth: int = 4) -> TokenMixer:
    """The job's ``stack`` entry point."""
    return TokenMixer(width=width, depth=depth)

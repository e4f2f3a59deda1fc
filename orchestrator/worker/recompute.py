"""Activation recompute for a stage's blocks: ``torch.utils.checkpoint``, one block at a time.

A stage whose plan says ``recompute: true`` runs each of its blocks (planner layers ``1..N``; the
embedding and the head run whole) through ``torch.utils.checkpoint.checkpoint`` with
``use_reentrant=False``: the forward keeps only the block's input, and the backward runs the
block's forward again to rebuild what it needs. PyTorch's own checkpoint is used as is; it also
restores the forward's RNG and autocast state for the recomputation, so the recomputed forward
is the same computation and the gradients equal those of the whole forward.

Only the runner's view of the layers is wrapped (:func:`stage_layers`): the engine's layers, their
parameter names, state dicts, optimizers and gradient hooks are the plain modules, so checkpoints
and re-plans move the same state whether a stage recomputes or not.

Seeded dropout (``worker/dropout.py``) counts each layer's forwards within a step to know which
microbatch it sees; the recomputation is not a new forward, so it runs at the count its forward
had (:func:`~orchestrator.worker.dropout.forward_position`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from orchestrator.worker import dropout


class Recomputed(nn.Module):
    """Runs ``inner`` under activation checkpointing; holds no state of its own."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        position = dropout.forward_position()
        calls = 0

        def run(inp: torch.Tensor) -> torch.Tensor:
            nonlocal calls
            calls += 1
            if calls == 1:
                return self.inner(inp)  # type: ignore[no-any-return]
            with dropout.replaying(position):  # the recomputation, during the backward
                return self.inner(inp)  # type: ignore[no-any-return]

        return checkpoint(run, x, use_reentrant=False)  # type: ignore[no-any-return]


def is_block(index: int, num_planner_layers: int) -> bool:
    """Planner layers ``1..N`` are blocks; 0 (embedding) and ``N + 1`` (head) are not."""
    return 0 < index < num_planner_layers - 1


def stage_layers(
    layers: Sequence[nn.Module], indices: range, num_planner_layers: int, recompute: bool
) -> list[nn.Module]:
    """The modules the runner calls in order: the blocks wrapped in :class:`Recomputed` when
    ``recompute``, else ``layers`` as they are."""
    if not recompute:
        return list(layers)
    return [
        Recomputed(layer) if is_block(i, num_planner_layers) else layer
        for i, layer in zip(indices, layers, strict=True)
    ]

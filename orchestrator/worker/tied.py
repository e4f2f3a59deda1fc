"""Tied weights across planner layers (an LM head that reuses the token embedding).

A layered model may declare ``tied_parameters``: groups of ``(planner layer, parameter name)``
that are one weight of the model. Each holder keeps its own copy (the first and the last stage
usually live on different ranks), and, as Megatron's embedding group does, the copies'
gradients are summed every step so every copy receives the tied weight's gradient and, with the
same optimizer state, stays equal to the others.

The sum is exact and counts every replica once: after the per-layer all-reduce each holder of a
layer has that layer's whole gradient; only one canonical holder per layer (the lowest rank
holding it) contributes it to one all-reduce over every rank holding any copy, the others
contribute zeros. Single-process training (the reference) sums the copies locally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.spec.plan import Plan
from orchestrator.worker import subgroups
from orchestrator.worker.layers import build_layers
from orchestrator.worker.topology import ranks_for_plan

TiedGroup = tuple[tuple[int, str], ...]


def tied_groups(model: Any) -> list[TiedGroup]:
    """The model's tied parameter groups (none for models that declare none)."""
    return [tuple(g) for g in getattr(model, "tied_parameters", []) or []]


def tied_copies(model: Any) -> set[tuple[int, str]]:
    """Every (layer, name) that is a copy of an earlier member of its group."""
    return {member for group in tied_groups(model) for member in group[1:]}


def _param(layers: dict[int, nn.Module], layer: int, name: str) -> nn.Parameter:
    return layers[layer].get_parameter(name)


def copy_initial_weights(
    model: Any, layers: dict[int, nn.Module], seed: int, device: torch.device
) -> None:
    """Make every copy this rank holds equal to its group's first member, as initialised (or
    loaded) by a rank that holds it; builds that layer here when this rank does not."""
    for group in tied_groups(model):
        (src_layer, src_name), *copies = group
        mine = [(i, n) for i, n in copies if i in layers]
        if not mine:
            continue
        source = layers.get(src_layer)
        if source is None:
            source = build_layers(model, range(src_layer, src_layer + 1), seed, device)[src_layer]
        with torch.no_grad():
            for i, n in mine:
                _param(layers, i, n).copy_(source.get_parameter(src_name))


def sum_local(model: Any, layers: dict[int, nn.Module]) -> None:
    """Single process: give every member of a group the sum of the members' gradients."""
    for group in tied_groups(model):
        params = [_param(layers, i, n) for i, n in group]
        total = sum((_grad(p) for p in params), torch.zeros_like(params[0]))
        for p in params:
            p.grad = total.clone()


class TiedGradients:
    """One process group per tied group over the ranks holding any member (collective setup)."""

    def __init__(self, model: Any, plan: Plan, rank: int) -> None:
        self.rank = rank
        self.groups: list[tuple[TiedGroup, list[tuple[int, str]], Any]] = []
        specs = ranks_for_plan(plan)
        for group in tied_groups(model):
            layers = {i for i, _ in group}
            holders = sorted(s.rank for s in specs if layers & set(s.layer_indices))
            # Canonical holder of each member: the lowest rank holding that layer.
            canonical = {
                member: min(s.rank for s in specs if member[0] in s.layer_indices)
                for member in group
            }
            handle = subgroups.new_group(holders) if len(holders) > 1 else None
            if rank in holders:
                counted = [m for m in group if canonical[m] == rank]
                self.groups.append((group, counted, handle))

    def all_reduce(self, layers: dict[int, nn.Module]) -> None:
        """After the per-layer all-reduce: every copy gets the sum over the members."""
        for group, counted, handle in self.groups:
            held = [m for m in group if m[0] in layers]
            like = _param(layers, *held[0])
            total = torch.zeros_like(like)
            for m in counted:
                total += _grad(_param(layers, *m))
            if handle is not None:
                dist.all_reduce(total, op=dist.ReduceOp.SUM, group=handle)
            for m in held:
                _param(layers, *m).grad = total.clone()


def _grad(p: nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def unique_parameters(
    model: Any, layers: dict[int, nn.Module], indices: Sequence[int] | None = None
) -> list[nn.Parameter]:
    """The parameters of ``layers`` without the tied copies (for norms and counts)."""
    copies = tied_copies(model)
    return [
        p
        for i in (indices if indices is not None else sorted(layers))
        for name, p in layers[i].named_parameters()
        if (i, name) not in copies
    ]

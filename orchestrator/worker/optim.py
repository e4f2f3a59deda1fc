"""Optimizers, one per planner layer, and global-norm gradient clipping.

Adam, AdamW and SGD update each parameter from its own gradient and state, so a per-layer
optimizer computes what one optimizer over the whole model computes, and its state saves and
loads by layer index whatever the stage boundaries. What is not per parameter is made so: the
learning rate is set from the step before every update (:class:`OptimizerRecipe`), and the
clipping norm is one number summed over every stage and replica (:func:`clip_coefficient`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from orchestrator.errors import SpecError
from orchestrator.worker.recipe import OptimizerRecipe

OPTIMIZERS = ("adam", "adamw", "sgd")
# torch.nn.utils.clip_grad_norm_'s guard against a zero norm.
CLIP_EPS = 1e-6


def make_optimizer(
    name: str, params: Iterable[torch.nn.Parameter], learning_rate: float
) -> torch.optim.Optimizer:
    """``adam`` (torch defaults otherwise) or ``sgd`` with momentum 0.9."""
    named = [(str(i), p) for i, p in enumerate(params)]
    return make_recipe_optimizer(OptimizerRecipe(name=name, learning_rate=learning_rate), named)


def optimizer_order(layer: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the order of the optimizer's state indices (its param groups in turn:
    the recipe puts 2+-dimensional tensors first), which need not be the layer's own order."""
    name_of = {id(p): name for name, p in layer.named_parameters()}
    return [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]


def make_recipe_optimizer(
    recipe: OptimizerRecipe, named_params: Iterable[tuple[str, nn.Parameter]]
) -> torch.optim.Optimizer:
    """The recipe's optimizer over ``named_params``: weight decay only on tensors of 2+ dims."""
    named = list(named_params)
    decay = [p for _, p in named if p.ndim >= 2]
    no_decay = [p for _, p in named if p.ndim < 2]
    groups = [
        g
        for g in (
            {"params": decay, "weight_decay": recipe.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        )
        if g["params"]
    ]
    return recipe_optimizer(recipe, groups)


def recipe_optimizer(
    recipe: OptimizerRecipe, groups: list[dict[str, Any]]
) -> torch.optim.Optimizer:
    """The recipe's optimizer over param ``groups`` that carry their own ``weight_decay``."""
    lr = recipe.learning_rate
    betas = (recipe.beta1, recipe.beta2)
    # adam's weight decay is the L2 term added to the gradient (torch.optim.Adam); adamw's is
    # decoupled (Loshchilov & Hutter 2019), the usual recipe for language models.
    if recipe.name == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=betas, eps=recipe.eps)
    if recipe.name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=recipe.eps)
    if recipe.name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    raise SpecError(
        f"unknown optimizer {recipe.name!r}",
        field="training.optimizer",
        fix=f"use one of {', '.join(OPTIMIZERS)}",
    )


def set_learning_rate(optimizer: torch.optim.Optimizer, learning_rate: float) -> None:
    """Set every group's learning rate (the schedule's value for this step)."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate


def squared_norm(params: Iterable[nn.Parameter], device: torch.device) -> torch.Tensor:
    """Sum of squared gradient entries on ``device`` (fp32; parameters without one add 0)."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    for p in params:
        if p.grad is not None:
            total += p.grad.detach().float().pow(2).sum()
    return total


def clip_coefficient(total_squared_norm: float, max_norm: float) -> float:
    """``min(1, max_norm / (norm + 1e-6))`` as ``torch.nn.utils.clip_grad_norm_`` computes it."""
    norm = total_squared_norm**0.5
    return min(1.0, max_norm / (norm + CLIP_EPS))


def scale_gradients(params: Iterable[nn.Parameter], coefficient: float) -> None:
    """Multiply every gradient by ``coefficient`` (a no-op at 1)."""
    if coefficient >= 1.0:
        return
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coefficient)

"""Single-process training on the whole global batch: what every plan must reproduce.

One process, every layer, one forward and backward over the global batch with its mean loss, one
optimizer over all parameters. Tests compare distributed runs against it; it also serves as the
plain baseline of the example.

In bf16/fp16 the forward runs under ``torch.autocast`` over fp32 parameters, as on the workers;
fp16 scales the loss with ``torch.amp.GradScaler`` itself, so the workers' pipeline-wide scaler is
checked against PyTorch's.
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.worker.data import DataConfig, make_dataset
from orchestrator.worker.dropout import sample_streams
from orchestrator.worker.layers import build_layers
from orchestrator.worker.model_api import build_model
from orchestrator.worker.optim import (
    clip_coefficient,
    make_recipe_optimizer,
    scale_gradients,
    set_learning_rate,
    squared_norm,
)
from orchestrator.worker.precision import PrecisionPolicy, parse_precision
from orchestrator.worker.recipe import OptimizerRecipe
from orchestrator.worker.tied import copy_initial_weights, sum_local, unique_parameters


class ReferenceTrainer:
    """The whole model in one process."""

    def __init__(
        self,
        model_factory: str,
        model_kwargs: dict[str, Any],
        data: DataConfig,
        global_batch_size: int,
        optimizer: str = "adam",
        learning_rate: float = 3e-4,
        seed: int = 0,
        recipe: OptimizerRecipe | None = None,
        precision: str = "fp32",
        loss_scale_init: float = 2.0**16,
    ) -> None:
        self.model = build_model(model_factory, model_kwargs)
        self.layers = build_layers(
            self.model, range(self.model.num_planner_layers), seed, torch.device("cpu")
        )
        copy_initial_weights(self.model, self.layers, seed, torch.device("cpu"))
        self.recipe = recipe or OptimizerRecipe(name=optimizer, learning_rate=learning_rate)
        self.optimizer = make_recipe_optimizer(self.recipe, named_all(self.layers))
        self.dataset = make_dataset(data, seed)
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.policy = PrecisionPolicy(parse_precision(precision), "cpu")
        self.skipped: list[bool] = []  # fp16: per step, whether GradScaler skipped it
        self.scaler = (
            torch.amp.GradScaler("cpu", init_scale=loss_scale_init)
            if self.policy.scales_loss
            else None
        )

    def train_step(self, step: int) -> float:
        """One step on the whole global batch; returns its mean loss."""
        inputs, targets = self.dataset.batch(
            step, self.global_batch_size, 0, self.global_batch_size
        )
        self.optimizer.zero_grad(set_to_none=True)
        with (
            self.policy.autocast(),
            sample_streams(self.seed, step, 0, [self.global_batch_size]),
        ):
            out = inputs
            for i in range(self.model.num_planner_layers):
                out = self.layers[i](out)
            loss = self.model.loss(out, targets).float()
        if self.scaler is None:
            loss.backward()
        else:
            scale_before = self.scaler.get_scale()
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)  # clipping and tied sums see true gradients
        sum_local(self.model, self.layers)
        if self.recipe.grad_clip_norm is not None:
            total = squared_norm(unique_parameters(self.model, self.layers), torch.device("cpu"))
            coefficient = clip_coefficient(float(total), self.recipe.grad_clip_norm)
            scale_gradients((p for _, p in named_all(self.layers)), coefficient)
        set_learning_rate(self.optimizer, self.recipe.learning_rate_at(step))
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.skipped.append(self.scaler.get_scale() < scale_before)
        return float(loss.detach())

    def layer_params(self) -> dict[int, dict[str, torch.Tensor]]:
        """Planner layer -> parameter tensors (copies)."""
        return {
            i: {k: v.detach().clone() for k, v in layer.state_dict().items()}
            for i, layer in self.layers.items()
        }


def named_all(layers: dict[int, torch.nn.Module]) -> list[tuple[str, torch.nn.Parameter]]:
    """Every parameter of ``layers`` (tied copies included), named ``layer.name``."""
    return [(f"{i}.{n}", p) for i, layer in layers.items() for n, p in layer.named_parameters()]

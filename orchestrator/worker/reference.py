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
from orchestrator.worker.engine import build_layers
from orchestrator.worker.model_api import build_model
from orchestrator.worker.optim import make_optimizer
from orchestrator.worker.precision import PrecisionPolicy, parse_precision


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
        precision: str = "fp32",
        loss_scale_init: float = 2.0**16,
    ) -> None:
        self.model = build_model(model_factory, model_kwargs)
        self.layers = build_layers(
            self.model, range(self.model.num_planner_layers), seed, torch.device("cpu")
        )
        params = [p for layer in self.layers.values() for p in layer.parameters()]
        self.optimizer = make_optimizer(optimizer, params, learning_rate)
        self.dataset = make_dataset(data, seed)
        self.global_batch_size = global_batch_size
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
        with self.policy.autocast():
            out = inputs
            for i in range(self.model.num_planner_layers):
                out = self.layers[i](out)
            loss = self.model.loss(out, targets).float()
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            scale_before = self.scaler.get_scale()
            self.scaler.scale(loss).backward()
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

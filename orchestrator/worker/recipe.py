"""The optimizer recipe: optimizer, weight decay, learning-rate schedule, gradient clipping.

Plain data (no torch), so the driver builds it from the job spec and ships it to the workers.
The learning rate is a pure function of the step (:meth:`OptimizerRecipe.learning_rate_at`), so a
resumed or re-planned run continues the schedule from its step number alone; the optimizers'
moments travel in the layer-indexed checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECAYS = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class OptimizerRecipe:
    """How every layer's parameters are updated.

    - ``name``: ``adam``, ``adamw`` (decoupled weight decay) or ``sgd`` (momentum 0.9).
    - ``weight_decay``: applied to matrices and embeddings only, never to norms or biases
      (parameters of one dimension), as GPT-2/nanoGPT/Megatron recipes do.
    - schedule: linear warm-up over ``warmup_steps`` from 0 to ``learning_rate``, then ``decay``
      to ``min_learning_rate`` at ``decay_steps`` (constant after it).
    - ``grad_clip_norm``: scale every gradient by ``min(1, clip / (||g|| + 1e-6))``, ``||g||``
      the global norm over every parameter of the model (each counted once), as
      ``torch.nn.utils.clip_grad_norm_`` would on the whole model.
    """

    name: str = "adam"
    learning_rate: float = 3e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 0
    decay: str = "constant"
    decay_steps: int = 0
    min_learning_rate: float = 0.0
    grad_clip_norm: float | None = None

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based)."""
        peak = self.learning_rate
        if step < self.warmup_steps:
            return peak * (step + 1) / self.warmup_steps
        if self.decay == "constant" or self.decay_steps <= self.warmup_steps:
            return peak
        progress = min(1.0, (step - self.warmup_steps) / (self.decay_steps - self.warmup_steps))
        if self.decay == "linear":
            factor = 1.0 - progress
        else:
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_learning_rate + (peak - self.min_learning_rate) * factor

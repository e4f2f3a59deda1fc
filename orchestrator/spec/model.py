"""Model and training descriptions.

A model is a GPT-style transformer decoder described by its shape. The planner sees it as
``num_layers + 2`` *planner layers*: index 0 is the embedding, 1..num_layers the blocks, and
``num_layers + 1`` the head (final norm and output projection). OPT-350 with 24 blocks has 26.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from orchestrator.spec.devices import Dtype


class LayerKind(StrEnum):
    EMBEDDING = "embedding"
    BLOCK = "block"
    HEAD = "head"


class ModelSpec(BaseModel):
    """Shape of a transformer decoder (learned positions, untied head, GELU MLP, LayerNorm)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    # Upper bounds: beyond any model trained today; a typo (1e9 layers) is refused at once.
    num_layers: PositiveInt = Field(le=1024)
    hidden_size: PositiveInt = Field(le=131072)
    num_heads: PositiveInt = Field(le=1024)
    ffn_hidden_size: PositiveInt | None = Field(default=None, le=1048576)
    sequence_length: PositiveInt = Field(le=1048576)
    vocab_size: PositiveInt = Field(le=4194304)
    dtype: Dtype = Dtype.BF16
    # The head reuses the token embedding matrix (GPT-2, GPT-Neo): it then owns only its LayerNorm.
    tie_embeddings: bool = False

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads}); pick num_heads among the divisors of hidden_size"
            )
        return self

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def num_planner_layers(self) -> int:
        """Embedding + blocks + head."""
        return self.num_layers + 2

    def layer_kind(self, index: int) -> LayerKind:
        if index == 0:
            return LayerKind.EMBEDDING
        if index == self.num_layers + 1:
            return LayerKind.HEAD
        if 1 <= index <= self.num_layers:
            return LayerKind.BLOCK
        raise IndexError(f"planner layer {index} outside 0..{self.num_layers + 1}")

    def layer_params(self, index: int) -> int:
        """Parameters of planner layer ``index`` (weights and biases)."""
        h, f = self.hidden_size, self.ffn_size
        kind = self.layer_kind(index)
        if kind is LayerKind.EMBEDDING:
            return self.vocab_size * h + self.sequence_length * h  # tokens + learned positions
        if kind is LayerKind.HEAD:
            if self.tie_embeddings:
                return 2 * h  # final LayerNorm; the projection is the embedding's matrix
            return 2 * h + self.vocab_size * h  # final LayerNorm + untied output projection
        # qkv (3h^2+3h) + out proj (h^2+h) + fc1 (hf+f) + fc2 (fh+h) + two LayerNorms (4h)
        return 4 * h * h + 2 * h * f + 9 * h + f

    @property
    def total_params(self) -> int:
        return sum(self.layer_params(i) for i in range(self.num_planner_layers))


class Optimizer(StrEnum):
    ADAM = "adam"
    SGD = "sgd"


class TrainingSpec(BaseModel):
    """How the model is trained: the batch, the microbatch candidates, the optimizer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    global_batch_size: PositiveInt = Field(default=64, le=1 << 24)
    microbatch_sizes: list[PositiveInt] = Field(default=[1, 2, 4, 8], min_length=1, max_length=16)
    optimizer: Optimizer = Optimizer.ADAM
    # Mixed precision keeps fp32 master weights beside 16-bit working copies (Micikevicius et al.
    # 2018); off means everything in the model's dtype.
    mixed_precision: bool = True
    # Upper bounds the search respects; None means "as many as the cluster allows".
    max_pipeline_stages: PositiveInt | None = None
    max_tensor_parallel: PositiveInt = 8

    @model_validator(mode="after")
    def _microbatches_sorted(self) -> TrainingSpec:
        too_big = [m for m in self.microbatch_sizes if m > self.global_batch_size]
        if too_big == self.microbatch_sizes:
            raise ValueError(
                f"every microbatch size {self.microbatch_sizes} exceeds global_batch_size "
                f"({self.global_batch_size}); list a microbatch size <= the global batch"
            )
        return self

    def state_bytes_per_param(self, model_dtype: Dtype) -> int:
        """Bytes of weights + gradients + optimizer state per parameter on its device.

        Mixed-precision Adam: 2 (16-bit weights) + 2 (16-bit grads) + 12 (fp32 master, m, v) = 16,
        the figure of the ZeRO paper (Rajbhandari et al. 2020, section 3.1). fp32 Adam: 4+4+8 = 16.
        SGD with momentum: weights + grads + momentum (+ fp32 master under mixed precision).
        """
        w = model_dtype.size_bytes if self.mixed_precision else 4
        if self.optimizer is Optimizer.ADAM:
            return 2 * w + (12 if self.mixed_precision and w == 2 else 8)
        return 2 * w + (8 if self.mixed_precision and w == 2 else 4)

    def grad_bytes_per_param(self, model_dtype: Dtype) -> int:
        """Bytes per parameter that the data-parallel all-reduce moves."""
        return model_dtype.size_bytes if self.mixed_precision else 4

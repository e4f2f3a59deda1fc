"""Model and training descriptions.

A model is a GPT-style transformer decoder described by its shape. The planner sees it as
``num_layers + 2`` *planner layers*: index 0 is the embedding, 1..num_layers the blocks, and
``num_layers + 1`` the head (final norm and output projection). OPT-350 with 24 blocks has 26.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from orchestrator.spec.devices import Dtype


class LayerKind(StrEnum):
    EMBEDDING = "embedding"
    BLOCK = "block"
    HEAD = "head"


class Norm(StrEnum):
    LAYERNORM = "layernorm"  # weight and bias
    RMSNORM = "rmsnorm"  # weight only


class Positions(StrEnum):
    LEARNED = "learned"  # a table of max_position_embeddings x hidden in the embedding layer
    ROTARY = "rotary"  # computed inside every block, no parameters


class ModelSpec(BaseModel):
    """Shape of a transformer decoder.

    The defaults describe a GPT (learned positions, untied head, GELU MLP, LayerNorm, biases); a
    Llama-family model sets ``num_kv_heads`` (grouped-query attention), ``gated_mlp`` (SwiGLU: gate,
    up and down matrices), ``norm: rmsnorm``, ``positions: rotary`` and ``bias: false``.
    ``orchestrator.spec.hf_config`` reads all of these from a Hugging Face ``config.json``.
    """

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
    # Grouped-query attention: key/value heads shared by num_heads / num_kv_heads query heads
    # (None: as many as query heads, plain multi-head attention).
    num_kv_heads: PositiveInt | None = None
    # Gated MLP (SwiGLU, GeGLU): three matrices hidden x ffn instead of two.
    gated_mlp: bool = False
    norm: Norm = Norm.LAYERNORM
    positions: Positions = Positions.LEARNED
    # Rows of the learned position table (None: sequence_length); GPT-2 has 1024 whatever the
    # training sequence length.
    max_position_embeddings: PositiveInt | None = None
    # Biases on every linear layer but the output projection (GPT-2); Llama has none.
    bias: bool = True
    # Counted parameters per planner layer, for models that are not a standard transformer (a
    # user's own stack of blocks, orchestrator.models.stack); overrides the formulas below.
    layer_param_counts: list[PositiveInt] | None = None

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads}); pick num_heads among the divisors of hidden_size"
            )
        if (
            self.layer_param_counts is not None
            and len(self.layer_param_counts) != self.num_layers + 2
        ):
            raise ValueError(
                f"layer_param_counts has {len(self.layer_param_counts)} entries; the model has "
                f"{self.num_layers + 2} planner layers (blocks + embedding + head)"
            )
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be divisible by num_kv_heads "
                f"({self.num_kv_heads}); pick num_kv_heads among the divisors of num_heads"
            )
        return self

    @property
    def kv_size(self) -> int:
        """Width of the key (and of the value) projection: kv heads x head dimension."""
        heads = self.num_kv_heads or self.num_heads
        return heads * (self.hidden_size // self.num_heads)

    @property
    def block_matmul_params(self) -> int:
        """Weights of one block's matrices (each costs 2 FLOPs per weight per token forward):
        query and output projections h x h, key and value h x kv_size, and two (plain) or three
        (gated) MLP matrices h x ffn."""
        h, f = self.hidden_size, self.ffn_size
        if self.layer_param_counts is not None:
            # Counted, not derived: every weight costs 2 FLOPs per token forward, as a matrix's.
            return self.layer_param_counts[1]
        mlp_matrices = 3 if self.gated_mlp else 2
        return 2 * h * h + 2 * h * self.kv_size + mlp_matrices * h * f

    def _norm_params(self) -> int:
        return 2 * self.hidden_size if self.norm is Norm.LAYERNORM else self.hidden_size

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
        if self.layer_param_counts is not None:
            return self.layer_param_counts[index]
        if kind is LayerKind.EMBEDDING:
            table = self.vocab_size * h
            if self.positions is Positions.LEARNED:
                table += (self.max_position_embeddings or self.sequence_length) * h
            return table
        if kind is LayerKind.HEAD:
            if self.tie_embeddings:
                # The final norm; the projection is the embedding's matrix. (The runtime keeps a
                # copy of it on the last stage; the planner charges memory for the norm alone.)
                return self._norm_params()
            return self._norm_params() + self.vocab_size * h
        # Matrices, then biases (q, k, v, out; MLP up (and gate), down), then two norms.
        biases = 0
        if self.bias:
            biases = 2 * h + 2 * self.kv_size + (2 if self.gated_mlp else 1) * f + h
        return self.block_matmul_params + biases + 2 * self._norm_params()

    @property
    def total_params(self) -> int:
        return sum(self.layer_params(i) for i in range(self.num_planner_layers))


class Schedule(StrEnum):
    """Pipeline schedules the workers run."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"


class Optimizer(StrEnum):
    ADAM = "adam"
    ADAMW = "adamw"  # Adam with decoupled weight decay: the same state as Adam
    SGD = "sgd"


# ``training.precision: auto``: the planner chooses (see TrainingSpec.precision).
AUTO_PRECISION = "auto"


class TrainingSpec(BaseModel):
    """How the model is trained: the batch, the microbatch candidates, the optimizer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    global_batch_size: PositiveInt = Field(default=64, le=1 << 24)
    microbatch_sizes: list[PositiveInt] = Field(default=[1, 2, 4, 8], min_length=1, max_length=16)
    optimizer: Optimizer = Optimizer.ADAM
    # Mixed precision keeps fp32 master weights beside 16-bit working copies (Micikevicius et al.
    # 2018); off means everything in the model's dtype.
    mixed_precision: bool = True
    # What the workers compute in: fp32, or bf16/fp16 over fp32 master weights (docs/runtime.md).
    # Unset: the workers run fp32 and the planner reads mixed_precision and the model's dtype as
    # before. Set: planner and workers both follow it, and mixed_precision must agree. "auto": the
    # planner picks the format every planned device runs fast (planner/auto_precision.py) and
    # the plan records it.
    precision: Dtype | Literal["auto"] | None = None
    # The planner may turn activation recompute on for the stages where memory forces it (the
    # plan then says so per stage); false: never, plans without it only.
    activation_recompute: bool = True
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

    @model_validator(mode="after")
    def _precision_agrees(self) -> TrainingSpec:
        sixteen_bit = self.precision is not None and self.precision is not Dtype.FP32
        mixed_off = "mixed_precision" in self.model_fields_set and not self.mixed_precision
        if self.precision == AUTO_PRECISION and mixed_off:
            raise ValueError(
                "mixed_precision: false contradicts precision: auto (the planner may pick a 16-bit "
                "format); drop mixed_precision (precision replaces it)"
            )
        if sixteen_bit and "mixed_precision" in self.model_fields_set and not self.mixed_precision:
            raise ValueError(
                f"mixed_precision: false contradicts precision: {self.precision}; "
                "drop mixed_precision (precision replaces it)"
            )
        return self

    @property
    def runtime_precision(self) -> Dtype:
        """What the workers compute in when the plan does not say (fp32 unless ``precision``
        names a format; a plan made under ``auto`` always records its format, which wins)."""
        return self.precision if isinstance(self.precision, Dtype) else Dtype.FP32

    @property
    def explicit_precision(self) -> Dtype | None:
        """The format ``precision`` names (None when unset or ``auto``)."""
        return self.precision if isinstance(self.precision, Dtype) else None

    def _mixed(self, model_dtype: Dtype) -> tuple[bool, int]:
        # (mixed precision?, bytes of a working weight/gradient) for the memory terms. ``auto``
        # is resolved before costing (costmodel/precision.py); costed here as the model's dtype.
        if not isinstance(self.precision, Dtype):
            return self.mixed_precision, model_dtype.size_bytes if self.mixed_precision else 4
        return self.precision is not Dtype.FP32, self.precision.size_bytes

    def state_bytes_per_param(self, model_dtype: Dtype) -> int:
        """Bytes of weights + gradients + optimizer state per parameter on its device.

        Mixed-precision Adam: 2 (16-bit weights) + 2 (16-bit grads) + 12 (fp32 master, m, v) = 16,
        the figure of the ZeRO paper (Rajbhandari et al. 2020, section 3.1). fp32 Adam: 4+4+8 = 16.
        SGD with momentum: weights + grads + momentum (+ fp32 master under mixed precision).
        """
        mixed, w = self._mixed(model_dtype)
        if self.optimizer in (Optimizer.ADAM, Optimizer.ADAMW):
            return 2 * w + (12 if mixed and w == 2 else 8)
        return 2 * w + (8 if mixed and w == 2 else 4)

    def grad_bytes_per_param(self, model_dtype: Dtype) -> int:
        """Bytes per parameter that the data-parallel all-reduce moves."""
        return self._mixed(model_dtype)[1]


def shape_defaults() -> dict[str, Any]:
    """Each :class:`ModelSpec` field that has a default, as a JSON-mode dump would show it."""
    out: dict[str, Any] = {}
    for name, info in ModelSpec.model_fields.items():
        if info.is_required():
            continue
        value = info.get_default(call_default_factory=True)
        out[name] = getattr(value, "value", value)  # enums as their values
    return out

"""A small GPT, cut into planner layers (nanoGPT-like).

Learned token and position embeddings, pre-LayerNorm blocks with causal self-attention and a GELU
MLP, a final LayerNorm and an untied output projection without bias: exactly the parameters
``orchestrator.spec.model.ModelSpec.layer_params`` counts. No dropout, so that every plan
reproduces single-process training.

Tensor parallel (Megatron-LM's split, Shoeybi et al. 2019): the query, key and value projections
and the MLP's first matrix are split by output columns (each rank computes whole heads), the
attention output projection and the MLP's second matrix by input rows, so each block needs one
all-reduce forward and one backward per sub-layer; embedding, norms and head stay replicated.
Query, key and value are separate matrices so that a column split hands each rank whole heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.errors import SpecError
from orchestrator.spec.devices import Dtype
from orchestrator.spec.model import ModelSpec

# Init as in GPT-2 / nanoGPT: N(0, 0.02) weights, zero biases.
INIT_STD = 0.02


class Embedding(nn.Module):
    """Planner layer 0: token + learned position embeddings."""

    def __init__(self, vocab_size: int, sequence_length: int, hidden_size: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, hidden_size)
        self.positions = nn.Embedding(sequence_length, hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(positions)


class Block(nn.Module):
    """Planner layers 1..N: pre-norm causal self-attention and a GELU MLP, both residual."""

    def __init__(self, hidden_size: int, num_heads: int, ffn_size: int) -> None:
        super().__init__()
        self.head_dim = hidden_size // num_heads
        self.ln1 = nn.LayerNorm(hidden_size)
        self.q = nn.Linear(hidden_size, hidden_size)
        self.k = nn.Linear(hidden_size, hidden_size)
        self.v = nn.Linear(hidden_size, hidden_size)
        self.proj = nn.Linear(hidden_size, hidden_size)
        self.ln2 = nn.LayerNorm(hidden_size)
        self.fc1 = nn.Linear(hidden_size, ffn_size)
        self.fc2 = nn.Linear(ffn_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        normed = self.ln1(x)
        q, k, v = self.q(normed), self.k(normed), self.v(normed)
        # Under tensor parallel q, k, v hold this rank's heads only: count them from the width.
        width = q.shape[-1]
        shape = (batch, seq, width // self.head_dim, self.head_dim)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, width))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Head(nn.Module):
    """Planner layer N+1: final LayerNorm and the untied output projection (logits)."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden_size)
        self.out = nn.Linear(hidden_size, vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def _init_weights(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=INIT_STD)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=INIT_STD)


class GPT:
    """A :class:`~orchestrator.worker.model_api.LayeredModel` for a GPT of a given shape."""

    def __init__(self, spec: ModelSpec) -> None:
        if spec.tie_embeddings:
            # A tied head shares the embedding's matrix across stages; the worker keeps every
            # parameter in exactly one planner layer.
            raise SpecError(
                f"model {spec.name!r} sets tie_embeddings; the example GPT has an untied head",
                field="model.tie_embeddings",
                fix="set tie_embeddings: false",
            )
        self.spec = spec
        self.name = spec.name

    @property
    def num_planner_layers(self) -> int:
        return self.spec.num_planner_layers

    def build_layer(self, index: int) -> nn.Module:
        s = self.spec
        kind = s.layer_kind(index).value
        layer: nn.Module
        if kind == "embedding":
            layer = Embedding(s.vocab_size, s.sequence_length, s.hidden_size)
        elif kind == "head":
            layer = Head(s.hidden_size, s.vocab_size)
        else:
            layer = Block(s.hidden_size, s.num_heads, s.ffn_size)
        _init_weights(layer)
        return layer

    def tensor_parallel_plan(self, index: int) -> dict[str, str]:
        """Submodule -> ``colwise`` / ``rowwise`` for planner layer ``index`` (empty: whole)."""
        if self.spec.layer_kind(index).value != "block":
            return {}
        return {
            "q": "colwise",
            "k": "colwise",
            "v": "colwise",
            "proj": "rowwise",
            "fc1": "colwise",
            "fc2": "rowwise",
        }

    def check_tensor_parallel(self, tp: int) -> None:
        """Raise :class:`SpecError` unless ``tp`` divides the heads and the MLP width."""
        s = self.spec
        if s.num_heads % tp or s.ffn_size % tp:
            raise SpecError(
                f"tp={tp} does not divide num_heads ({s.num_heads}) and the MLP width "
                f"({s.ffn_size})",
                field="plan.replicas[].stages[].tp",
                fix="use a tp degree that divides both",
            )

    def boundary_shape(self, batch_size: int) -> tuple[int, ...]:
        return (batch_size, self.spec.sequence_length, self.spec.hidden_size)

    @property
    def boundary_dtype(self) -> torch.dtype:
        return torch.float32

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross-entropy over the microbatch's tokens (equal tokens per sample)."""
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


def make_gpt(
    num_layers: int = 4,
    hidden_size: int = 64,
    num_heads: int = 4,
    sequence_length: int = 64,
    vocab_size: int = 256,
    ffn_hidden_size: int | None = None,
    name: str = "gpt-tiny",
    dtype: str = "fp32",
    tie_embeddings: bool = False,
) -> GPT:
    """Model factory for job specs: ``orchestrator.models.gpt:make_gpt`` with shape kwargs.

    ``vocab_size`` 256 matches the byte tokenizer. ``dtype`` is what the planner assumes; the
    worker trains in fp32. ``tie_embeddings`` is refused (the example's head is untied).
    """
    spec = ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        sequence_length=sequence_length,
        vocab_size=vocab_size,
        ffn_hidden_size=ffn_hidden_size,
        dtype=Dtype(dtype),
        tie_embeddings=tie_embeddings,
    )
    return GPT(spec)

"""Hugging Face causal language models, cut into planner layers.

``make_hf_model(path=DIR)`` reads ``DIR/config.json`` and returns a
:class:`~orchestrator.worker.model_api.LayeredModel` whose planner layers are the model's own
pieces, built from transformers' classes (so the arithmetic is the library's):

- layer 0: the token embedding (GPT-2: plus the learned position table);
- layers 1..N: one decoder block each (``GPT2Block``; ``LlamaDecoderLayer`` or the Mistral/Qwen2
  equivalent), rotary position embeddings computed inside the block's stage, causal attention
  through SDPA's ``is_causal`` (every sample is a full window, so no padding mask is needed);
- layer N+1: the final norm and the LM head.

Each worker builds only its stage's layers, and with ``pretrained`` (the default when the folder
has ``*.safetensors``) each layer reads only its own tensors from the files. A tied LM head
(GPT-2) is a copy of the embedding on the last stage; ``tied_parameters`` tells the engine to sum
the two copies' gradients every step (orchestrator.worker.tied), so they stay equal and the update
is the tied model's. ``hf_names(i)`` maps layer ``i``'s parameter names to the model's own, which
the exporter (orchestrator.models.hf_export) uses to write a folder ``from_pretrained`` loads.

Dropout is off (its probabilities set to 0) unless ``dropout=True``: then the config's dropout
runs with randomness seeded per (step, layer, sample) (orchestrator.worker.dropout), so every plan
still computes the same update.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.errors import SpecError
from orchestrator.spec.hf_config import GPT2_TYPES, LLAMA_TYPES, read_hf_config
from orchestrator.spec.model import ModelSpec

log = logging.getLogger(__name__)

DROPOUT_FIELDS = (
    "attn_pdrop",
    "resid_pdrop",
    "embd_pdrop",
    "summary_first_dropout",
    "attention_dropout",
    "hidden_dropout",
)


def dropout_of(config: Any) -> dict[str, float]:
    """The config's non-zero dropout probabilities."""
    return {f: float(getattr(config, f)) for f in DROPOUT_FIELDS if getattr(config, f, 0)}


def hf_config(folder: Path | str, dropout: bool = False) -> Any:
    """A transformers config from ``folder/config.json``, attention through SDPA; dropout off
    unless ``dropout`` (then seeded per step, layer and sample: orchestrator.worker.dropout)."""
    from transformers import AutoConfig

    read_hf_config(folder)  # one-line errors for a missing or unsupported config
    config = AutoConfig.from_pretrained(str(folder))
    dropped = dropout_of(config)
    if not dropout:
        for f in dropped:
            setattr(config, f, 0.0)
        if dropped:
            log.info("dropout switched off (set dropout: true to keep it): %s", dropped)
    config._attn_implementation = "sdpa"
    return config


class _GPT2Embedding(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)  # as GPT2Model applies after the sum

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.wte(ids) + self.wpe(positions))  # type: ignore[no-any-return]


class _Seeded(nn.Module):
    """A planner layer whose dropout is seeded per (step, layer, sample)."""

    def __init__(self, inner: nn.Module, index: int) -> None:
        super().__init__()
        self.inner = inner
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from orchestrator.worker.dropout import seeded_forward

        return seeded_forward(self.inner, self.index, x)


class _GPT2Layer(nn.Module):
    def __init__(self, config: Any, index: int) -> None:
        super().__init__()
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        self.block = GPT2Block(config, layer_idx=index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


class _GPT2Head(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def _llama_classes(model_type: str) -> tuple[type[nn.Module], type[nn.Module], type[nn.Module]]:
    """The decoder layer, RMSNorm and rotary embedding classes of a Llama-family model type."""
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    names = dir(module)

    def one(suffix: str) -> type[nn.Module]:
        found = [n for n in names if n.endswith(suffix) and not n.startswith("_")]
        if not found:
            raise SpecError(f"transformers has no {suffix} for model type {model_type!r}")
        return getattr(module, sorted(found, key=len)[0])  # type: ignore[no-any-return]

    return one("DecoderLayer"), one("RMSNorm"), one("RotaryEmbedding")


class _LlamaEmbedding(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)  # type: ignore[no-any-return]


class _LlamaLayer(nn.Module):
    def __init__(self, config: Any, index: int) -> None:
        super().__init__()
        decoder, _, rotary = _llama_classes(config.model_type)
        self.layer = decoder(config, index)
        # No parameters (its frequencies are non-persistent buffers): every stage computes the
        # rotary angles of its own blocks, so nothing but hidden states crosses a boundary.
        self.rotary = rotary(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        position_ids = torch.arange(x.shape[1], device=x.device)[None, :]
        cos_sin = self.rotary(x, position_ids)
        out = self.layer(x, position_embeddings=cos_sin, position_ids=position_ids)
        return out[0] if isinstance(out, tuple) else out


class _LlamaHead(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        _, norm, _ = _llama_classes(config.model_type)
        self.norm = norm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))  # type: ignore[no-any-return]


class HFCausalLM:
    """A :class:`~orchestrator.worker.model_api.LayeredModel` over a Hugging Face folder."""

    def __init__(
        self,
        folder: Path | str,
        sequence_length: int,
        name: str | None = None,
        pretrained: bool | None = None,
        dropout: bool = False,
    ) -> None:
        self.folder = Path(folder)
        self.config = hf_config(self.folder, dropout)
        self.dropout = dropout and bool(dropout_of(self.config))
        self.model_type: str = self.config.model_type
        self.name = name or self.folder.resolve().name
        self.sequence_length = sequence_length
        self.num_blocks = int(self.config.num_hidden_layers)
        self.hidden_size = int(self.config.hidden_size)
        self.tied = bool(getattr(self.config, "tie_word_embeddings", False))
        max_positions = int(
            getattr(self.config, "n_positions", 0) or self.config.max_position_embeddings
        )
        if sequence_length > max_positions:
            raise SpecError(
                f"sequence_length {sequence_length} exceeds model {self.name!r}'s "
                f"{max_positions} positions",
                field="model.shape.sequence_length",
                fix=f"train on at most {max_positions} tokens per sample",
            )
        window = getattr(self.config, "sliding_window", None)
        if getattr(self.config, "use_sliding_window", True) and window and sequence_length > window:
            raise SpecError(
                f"sequence_length {sequence_length} exceeds the sliding attention window {window}",
                field="model.shape.sequence_length",
                fix=f"train on at most {window} tokens per sample",
            )
        self.weight_files = sorted(self.folder.glob("*.safetensors"))
        self.pretrained = bool(self.weight_files) if pretrained is None else pretrained
        if self.pretrained and not self.weight_files:
            raise SpecError(
                f"{self.folder} has no *.safetensors weights",
                field="model.pretrained",
                fix="add the weights, or set pretrained: false to train from the config",
            )
        self._key_to_file: dict[str, Path] | None = None

    # -- LayeredModel --------------------------------------------------------------------------

    @property
    def num_planner_layers(self) -> int:
        return self.num_blocks + 2

    @property
    def head_index(self) -> int:
        return self.num_blocks + 1

    def build_layer(self, index: int) -> nn.Module:
        layer = self._new_layer(index)
        if self.pretrained:
            self._load_layer(index, layer)
        else:
            self._init_layer(layer)
        if self.dropout and index != self.head_index:
            # Parameter names gain "inner."; hf_names strips it.
            return _Seeded(layer, index)
        return layer

    def boundary_shape(self, batch_size: int) -> tuple[int, ...]:
        return (batch_size, self.sequence_length, self.hidden_size)

    @property
    def boundary_dtype(self) -> torch.dtype:
        return torch.float32

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over the microbatch's tokens (as the HF model's own)."""
        return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), targets.reshape(-1))

    @property
    def tied_parameters(self) -> list[tuple[tuple[int, str], ...]]:
        """Groups of (planner layer, parameter name) that are one weight in the model."""
        if not self.tied:
            return []
        embedding = "wte.weight" if self.model_type in GPT2_TYPES else "embed_tokens.weight"
        if self.dropout:
            embedding = "inner." + embedding
        return [((0, embedding), (self.head_index, "lm_head.weight"))]

    # -- names ---------------------------------------------------------------------------------

    def hf_names(self, index: int, local_names: list[str]) -> dict[str, str]:
        """Local parameter name -> the Hugging Face model's name, for planner layer ``index``."""
        gpt2 = self.model_type in GPT2_TYPES
        base = "transformer." if gpt2 else "model."
        names = {}
        for wrapped in local_names:
            local = wrapped.removeprefix("inner.")
            if index == 0:
                names[local] = base + local
            elif index == self.head_index:
                if local == "lm_head.weight":
                    names[local] = "lm_head.weight"
                else:
                    names[local] = base + local
            else:
                inner = local.partition(".")[2]  # drop "block." / "layer."
                names[local] = f"{base}{'h' if gpt2 else 'layers'}.{index - 1}.{inner}"
            names[wrapped] = names.pop(local)
        return names

    # -- building ------------------------------------------------------------------------------

    def _new_layer(self, index: int) -> nn.Module:
        if not 0 <= index <= self.head_index:
            raise IndexError(f"planner layer {index} outside 0..{self.head_index}")
        c = self.config
        if self.model_type in GPT2_TYPES:
            if index == 0:
                return _GPT2Embedding(c)
            if index == self.head_index:
                return _GPT2Head(c)
            return _GPT2Layer(c, index - 1)
        if self.model_type in LLAMA_TYPES:
            if index == 0:
                return _LlamaEmbedding(c)
            if index == self.head_index:
                return _LlamaHead(c)
            return _LlamaLayer(c, index - 1)
        raise SpecError(f"model type {self.model_type!r} is not supported")

    def _init_layer(self, layer: nn.Module) -> None:
        """The models' own initialisation: N(0, initializer_range) matrices, zero biases, unit
        norms; GPT-2 scales its residual projections by 1/sqrt(2 x layers)."""
        from transformers.pytorch_utils import Conv1D

        std = float(self.config.initializer_range)
        for name, m in layer.named_modules():
            if isinstance(m, (nn.Linear, Conv1D, nn.Embedding)):
                scaled = self.model_type in GPT2_TYPES and name.endswith("c_proj")
                residual_std = std / math.sqrt(2 * self.num_blocks)
                nn.init.normal_(m.weight, std=residual_std if scaled else std)
                bias = getattr(m, "bias", None)
                if bias is not None:
                    nn.init.zeros_(bias)

    def _files_by_key(self) -> dict[str, Path]:
        if self._key_to_file is None:
            from safetensors import safe_open

            index = self.folder / "model.safetensors.index.json"
            if index.is_file():
                weight_map = json.loads(index.read_text())["weight_map"]
                self._key_to_file = {k: self.folder / f for k, f in weight_map.items()}
            else:
                self._key_to_file = {}
                for path in self.weight_files:
                    with safe_open(str(path), framework="pt") as f:
                        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                            self._key_to_file[key] = path
        return self._key_to_file

    def _candidates(self, hf_name: str) -> Iterator[str]:
        yield hf_name
        # Older GPT-2 checkpoints store the base model's names without "transformer.".
        for prefix in ("transformer.", "model."):
            if hf_name.startswith(prefix):
                yield hf_name[len(prefix) :]
        if hf_name == "lm_head.weight" and self.tied:
            embedding = self.hf_names(0, [n for n, _ in self._new_layer(0).named_parameters()])
            yield from (v for v in embedding.values() if v.endswith("wte.weight") or "embed" in v)

    def _load_layer(self, index: int, layer: nn.Module) -> None:
        """Copy this layer's tensors (only these) from the folder's safetensors files."""
        from safetensors import safe_open

        files = self._files_by_key()
        state = layer.state_dict()
        names = self.hf_names(index, list(state))
        loaded: dict[str, torch.Tensor] = {}
        for local, hf_name in names.items():
            key = next((k for k in self._candidates(hf_name) if k in files), None)
            if key is None:
                raise SpecError(
                    f"{self.folder}: weights lack {hf_name!r} (planner layer {index})",
                    field="model.huggingface",
                    fix="use the safetensors files that belong to this config.json",
                )
            with safe_open(str(files[key]), framework="pt") as f:
                tensor = f.get_tensor(key)
            if tuple(tensor.shape) != tuple(state[local].shape):
                raise SpecError(
                    f"{self.folder}: {key!r} has shape {tuple(tensor.shape)}, the config implies "
                    f"{tuple(state[local].shape)}",
                    field="model.huggingface",
                    fix="use the safetensors files that belong to this config.json",
                )
            loaded[local] = tensor.to(torch.float32)
        layer.load_state_dict(loaded)


def make_hf_model(
    path: str,
    sequence_length: int | None = None,
    pretrained: bool | None = None,
    name: str | None = None,
    dropout: bool = False,
    **_shape: Any,
) -> HFCausalLM:
    """Model factory: ``orchestrator.models.hf_causal:make_hf_model`` with ``path`` (the folder).

    The job's shape fields arrive too (the runtime passes them to every factory); only
    ``sequence_length`` and ``name`` are used, the rest comes from config.json.
    """
    if sequence_length is None:
        raise SpecError("make_hf_model needs sequence_length", field="model.shape")
    return HFCausalLM(path, sequence_length, name=name, pretrained=pretrained, dropout=dropout)


def hf_model_spec(model: HFCausalLM) -> ModelSpec:
    """The planner's shape of an adapted model (from its config.json)."""
    from orchestrator.spec.hf_config import model_spec_from_hf_config

    return model_spec_from_hf_config(
        read_hf_config(model.folder), model.name, model.sequence_length
    )

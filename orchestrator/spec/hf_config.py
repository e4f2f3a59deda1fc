"""The planner's model shape from a Hugging Face model folder's ``config.json``.

Pure (json only): ``orchestrator plan --model DIR`` and a job's ``model: {huggingface: DIR}`` read
the shape from the config the weights came with, so it is never typed twice. Two families are
understood: GPT-2 (learned positions, LayerNorm, GELU MLP, biases, tied head) and Llama, whose
config layout Mistral, Qwen2 and similar decoders share (rotary positions, RMSNorm, SwiGLU,
grouped-query attention, no biases).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.errors import SpecError
from orchestrator.spec.devices import Dtype
from orchestrator.spec.model import ModelSpec, Norm, Positions

CONFIG_FILE = "config.json"
GPT2_TYPES = frozenset({"gpt2"})
# Decoders whose config uses Llama's field names and whose blocks have Llama's parameters.
LLAMA_TYPES = frozenset({"llama", "mistral", "qwen2"})
SUPPORTED_TYPES = GPT2_TYPES | LLAMA_TYPES

_DTYPES = {"float32": Dtype.FP32, "float16": Dtype.FP16, "bfloat16": Dtype.BF16}


def is_hf_folder(path: Path | str) -> bool:
    """Whether ``path`` is a directory holding a ``config.json``."""
    p = Path(path)
    return p.is_dir() and (p / CONFIG_FILE).is_file()


def read_hf_config(folder: Path | str) -> dict[str, Any]:
    """The parsed ``config.json`` of ``folder``, with one-line errors."""
    path = Path(folder) / CONFIG_FILE
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise SpecError(
            f"cannot read {path}: {exc.strerror or exc}",
            field="model.huggingface",
            fix="point to a Hugging Face model folder (config.json, optional *.safetensors)",
        ) from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not valid JSON ({exc.msg})", fix="fix the file") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a JSON object", fix="fix the file")
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        raise SpecError(
            f"{path}: model_type {model_type!r} is not supported",
            field="model.huggingface",
            fix=f"use a model of type {', '.join(sorted(SUPPORTED_TYPES))}, or bring a "
            "LayeredModel factory (docs/models.md)",
        )
    return raw


def model_spec_from_hf_config(
    config: dict[str, Any], name: str, sequence_length: int | None = None
) -> ModelSpec:
    """The :class:`ModelSpec` of a parsed GPT-2 or Llama-family ``config.json``.

    ``sequence_length`` is the training length (default: the model's maximum context).
    """
    model_type = config.get("model_type")
    dtype = _DTYPES.get(str(config.get("torch_dtype") or config.get("dtype") or ""), Dtype.FP32)
    try:
        if model_type in GPT2_TYPES:
            hidden = int(config.get("n_embd", 768))
            positions = int(config.get("n_positions", 1024))
            fields: dict[str, Any] = {
                "num_layers": int(config.get("n_layer", 12)),
                "hidden_size": hidden,
                "num_heads": int(config.get("n_head", 12)),
                "ffn_hidden_size": int(config.get("n_inner") or 4 * hidden),
                "vocab_size": int(config.get("vocab_size", 50257)),
                "max_position_embeddings": positions,
                "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
                "norm": Norm.LAYERNORM,
                "positions": Positions.LEARNED,
                "bias": True,
            }
        else:
            positions = int(config.get("max_position_embeddings", 2048))
            heads = int(config["num_attention_heads"])
            fields = {
                "num_layers": int(config["num_hidden_layers"]),
                "hidden_size": int(config["hidden_size"]),
                "num_heads": heads,
                "num_kv_heads": int(config.get("num_key_value_heads") or heads),
                "ffn_hidden_size": int(config["intermediate_size"]),
                "gated_mlp": True,
                "vocab_size": int(config["vocab_size"]),
                "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
                "norm": Norm.RMSNORM,
                "positions": Positions.ROTARY,
                "bias": False,
            }
        return ModelSpec(
            name=name, sequence_length=sequence_length or positions, dtype=dtype, **fields
        )
    except KeyError as exc:
        raise SpecError(
            f"config.json of {name!r} lacks {exc.args[0]!r}",
            field="model.huggingface",
            fix="use a complete Hugging Face config.json",
        ) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SpecError(
            f"config.json of {name!r} describes an unusable shape: {first['msg']}",
            field="model.huggingface",
        ) from None


def load_hf_model_spec(folder: Path | str, sequence_length: int | None = None) -> ModelSpec:
    """Read ``folder/config.json`` into the planner's shape (named after the folder)."""
    p = Path(folder)
    return model_spec_from_hf_config(read_hf_config(p), p.resolve().name, sequence_length)

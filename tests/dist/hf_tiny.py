"""Tiny Hugging Face model folders built from configs (no downloads), for the adapter tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 96
SEQ = 16


def tiny_config(kind: str) -> Any:
    """``gpt2`` (tied head, dropout configured), ``llama`` (grouped-query attention, SwiGLU,
    untied), ``llama-tied`` (a Qwen2-sized tied Llama) or ``mistral``."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig

    if kind == "gpt2":
        return GPT2Config(
            n_layer=3,
            n_embd=32,
            n_head=4,
            n_positions=32,
            vocab_size=VOCAB,
            bos_token_id=0,
            eos_token_id=0,
        )
    common: dict[str, Any] = {
        "num_hidden_layers": 3,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "vocab_size": VOCAB,
        "max_position_embeddings": 64,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    if kind == "llama":
        return LlamaConfig(tie_word_embeddings=False, **common)
    if kind == "llama-tied":
        return LlamaConfig(tie_word_embeddings=True, **common)
    if kind == "mistral":
        return MistralConfig(tie_word_embeddings=False, sliding_window=None, **common)
    raise ValueError(kind)


def make_folder(root: Path, kind: str, weights: bool = False, seed: int = 0) -> Path:
    """Write ``root/kind`` with config.json (and model.safetensors of a seeded HF model)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = root / kind
    config = tiny_config(kind)
    if weights:
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    else:
        config.save_pretrained(folder)
    return folder


def hf_model(folder: Path) -> Any:
    """The library's own model of ``folder`` (weights if present), SDPA attention, eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if list(folder.glob("*.safetensors")):
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")
    else:
        config = AutoConfig.from_pretrained(folder)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.eval()

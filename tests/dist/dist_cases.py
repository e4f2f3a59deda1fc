"""Cases the torch.distributed tests share: a tiny GPT, plans from literals, comparisons."""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.spec.plan import Plan
from orchestrator.worker.data import DataConfig
from orchestrator.worker.engine import EngineConfig
from orchestrator.worker.reference import ReferenceTrainer

GPT_FACTORY = "orchestrator.models.gpt:make_gpt"
# 3 blocks -> 5 planner layers: 0 embedding, 1..3 blocks, 4 head.
TINY_GPT = {"num_layers": 3, "hidden_size": 32, "num_heads": 4, "sequence_length": 16}
DATA = DataConfig(sequence_length=16)
LEARNING_RATE = 1e-3


def make_plan(
    replicas: list[tuple[int, list[tuple[tuple[int, int], str]]]], microbatch_size: int = 2
) -> Plan:
    """``[(batch_size, [((start, end), device_type), ...]), ...]`` -> Plan."""
    return Plan.model_validate(
        {
            "global_batch_size": sum(b for b, _ in replicas),
            "microbatch_size": microbatch_size,
            "replicas": [
                {
                    "batch_size": b,
                    "stages": [{"layers": list(span), "device_type": d} for span, d in stages],
                }
                for b, stages in replicas
            ],
        }
    )


def engine_config(plan: Plan, **overrides: Any) -> EngineConfig:
    fields: dict[str, Any] = {
        "model_factory": GPT_FACTORY,
        "model_kwargs": dict(TINY_GPT),
        "plan": plan,
        "rank": 0,
        "data": DATA,
        "learning_rate": LEARNING_RATE,
    }
    fields.update(overrides)
    return EngineConfig(**fields)


def reference_params(
    plan: Plan, num_steps: int, optimizer: str = "adam"
) -> tuple[dict[int, dict[str, torch.Tensor]], list[float]]:
    """Single-process fp32 training on the whole global batch: parameters and losses."""
    ref = ReferenceTrainer(
        GPT_FACTORY,
        dict(TINY_GPT),
        DATA,
        plan.global_batch_size,
        optimizer=optimizer,
        learning_rate=LEARNING_RATE,
    )
    losses = [ref.train_step(step) for step in range(num_steps)]
    return ref.layer_params(), losses


def layer_relative_errors(
    states: dict[int, dict[str, Any]], reference: dict[int, dict[str, torch.Tensor]]
) -> dict[int, float]:
    """Per planner layer: ||theta - theta_ref|| / ||theta_ref|| over all its parameters."""
    assert sorted(states) == sorted(reference), "a layer is missing"
    errors = {}
    for layer, ref in reference.items():
        got = states[layer]["params"]
        diff = torch.cat([(got[k] - ref[k]).reshape(-1) for k in sorted(ref)])
        base = torch.cat([ref[k].reshape(-1) for k in sorted(ref)])
        errors[layer] = float(diff.norm() / base.norm())
    return errors


def tensor_relative_errors(
    states: dict[int, dict[str, Any]], reference: dict[int, dict[str, torch.Tensor]]
) -> dict[str, float]:
    """Per parameter tensor: max |theta - theta_ref| / max |theta_ref|.

    The query, key and value projections count as one tensor (the attention input projection):
    the key bias alone has a zero gradient in exact arithmetic (see test_exactness), so its
    values are rounding noise with no scale of their own.
    """
    errors = {}
    for layer, ref in reference.items():
        got = states[layer]["params"]
        for key, (a, b) in _joined_qkv(got, ref).items():
            errors[f"{layer}.{key}"] = float((a - b).abs().max() / b.abs().max())
    return errors


def _joined_qkv(
    got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for k in ref:
        prefix, _, suffix = k.partition(".")
        if prefix in ("q", "k", "v") and all(f"{x}.{suffix}" in ref for x in "qkv"):
            names = [f"{x}.{suffix}" for x in "qkv"]
            out[f"qkv.{suffix}"] = (
                torch.cat([got[n].reshape(-1) for n in names]),
                torch.cat([ref[n].reshape(-1) for n in names]),
            )
        else:
            out[k] = (got[k], ref[k])
    return out


def repeated_text_dataset(sequence_length: int, seed: int, text: str = "abc") -> object:
    """A dataset factory for tests: ``text`` repeated, as a byte corpus."""
    from orchestrator.worker.data import CorpusDataset

    return CorpusDataset((text * 100).encode(), sequence_length, seed)

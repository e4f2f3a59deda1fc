"""Per-device memory: model state for a stage's layers plus activations in flight.

Activation bytes per transformer block follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", eq. 2 and 3): ``s b h (34 + 5 a s / h)`` bytes with
16-bit activations and no recomputation; with tensor parallel degree ``t`` (no sequence parallel)
``s b h (10 + 24 / t + 5 a s / (h t))``. Sailor's measured OPT-350 block (360.7 MB at b=1) is within
12% of the formula's 407 MB.
"""

from __future__ import annotations

from orchestrator.spec.model import LayerKind, ModelSpec, TrainingSpec

# The head keeps fp32 logits for the softmax cross-entropy backward (4 bytes per logit).
LOGIT_BYTES = 4


def activation_bytes_per_microbatch(
    model: ModelSpec, layer: int, microbatch_size: int, tp: int
) -> float:
    """Bytes one microbatch leaves on the device for the backward pass of ``layer``."""
    s, h, a, b = model.sequence_length, model.hidden_size, model.num_heads, microbatch_size
    scale = model.dtype.size_bytes / 2  # the formula counts 16-bit activations
    kind = model.layer_kind(layer)
    if kind is LayerKind.EMBEDDING:
        return s * b * h * model.dtype.size_bytes * 1.5 / tp  # output + dropout mask (1 B)
    if kind is LayerKind.HEAD:
        return s * b * (model.vocab_size * LOGIT_BYTES + 2 * h * model.dtype.size_bytes) / tp
    return s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)) * scale


def state_bytes(model: ModelSpec, training: TrainingSpec, layer: int, tp: int) -> float:
    """Weights, gradients and optimizer state of ``layer`` on one of its ``tp`` devices."""
    return model.layer_params(layer) / tp * training.state_bytes_per_param(model.dtype)


def microbatches_in_flight(
    stage: int, num_stages: int, num_microbatches: int, schedule: str
) -> int:
    """Microbatches whose activations a stage holds at its peak.

    Under 1F1B stage ``s`` of ``p`` runs ``p - s`` forwards before its first backward, so it holds
    up to ``p - s`` (the first stage the most); GPipe holds all ``m``.
    """
    if schedule == "gpipe":
        return num_microbatches
    return min(num_stages - stage, num_microbatches)

"""Building a rank's planner layers from a :class:`~orchestrator.worker.model_api.LayeredModel`.

Its own module so that the engine and the pieces it uses (tied weights, the profiler, the
single-process reference) build layers the same way without importing each other.
"""

from __future__ import annotations

import torch
from torch import nn

from orchestrator.worker.model_api import LayeredModel


def build_layers(
    model: LayeredModel, indices: range, seed: int, device: torch.device
) -> dict[int, nn.Module]:
    """Build planner layers ``indices``, each under its own seed (``seed + index``), so a layer
    starts the same wherever it is built."""
    layers: dict[int, nn.Module] = {}
    for i in indices:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + i)
            layers[i] = model.build_layer(i).to(device=device, dtype=torch.float32)
    return layers

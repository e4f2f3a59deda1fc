"""Layer times in context: the whole model timed as one stage call, as an emulated rank runs it.

The profiler (``worker/profiler.py``) times each layer as a call of its own, many times back to
back. A running rank computes its stage per microbatch as one forward call over all its layers
and one backward call (``worker/pipeline.py``), and under emulation each call follows a sleep
(``worker/emulation.py``: the stretch pads a call to ``factor x`` its least thread CPU time). On a
2-core host, measured with ``bench/emulated_stage_calls.py``, the whole model as one call took
1.11-1.22x the sum of its layers timed one by one, and 1.27-1.34x through the stretch: the layers
of a chain do not find each other's weights in the caches the way a layer repeated alone finds
its own, and a call after a sleep finds them colder still. The sum of isolated layers then
predicts an emulated rank's compute 25-45% short.

:func:`measure_in_context` times the model's layers as one forward call and one backward call,
each after the sleep the stretch would put before it (capped, see ``MAX_SLEEP_S``), and returns
the ratio of the least thread CPU time of each call to the sum of the layers' own least times.
The profiler scales every layer's emulated forward and backward by these ratios, so the layers
keep their relative sizes (the isolated profile) and sum to what the stage call costs. The ratio
includes what a call costs beyond its layers, so where it is applied the per-call terms
(``worker/call_terms.py``) are not measured again.

Emulation only: on real devices the per-layer figures are medians of the wall clock and
kernels of neighbouring layers do not share a CPU cache; a chain measurement there is left to the
per-call terms.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from orchestrator.worker.model_api import LayeredModel

# A sleep this long already leaves the caches as cold as the rank's longer ones (the point is
# what the call finds, not how long the core was idle), and keeps a 16x profile short.
MAX_SLEEP_S = 0.2


@dataclass(frozen=True)
class InContextRatio:
    """Least CPU time of the whole model as one call over the sum of its layers' own."""

    forward: float
    backward: float
    # The calls' least thread CPU seconds, as measured (for the profile's record).
    forward_cpu_s: float
    backward_cpu_s: float


def measure_in_context(
    model: LayeredModel,
    layers: dict[int, nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    factor: float,
    layers_forward_cpu_s: Sequence[float],
    layers_backward_cpu_s: Sequence[float],
    repeats: int = 15,
) -> InContextRatio:
    """The ratios of the whole model's stage calls to its layers' summed least CPU times.

    ``layers_*_cpu_s`` are the layers' own least thread CPU seconds (not stretched) at this
    microbatch size; ``factor`` is the emulation's stretch, which sets the sleep before each call.
    """
    if factor <= 1.0:
        raise ValueError("in-context timing is for emulated (stretched) devices only")
    ordered = [layers[i] for i in sorted(layers)]
    forward_s: list[float] = []
    backward_s: list[float] = []
    for run in range(repeats + 1):  # the first run warms up
        time.sleep(_sleep_before(factor, forward_s))
        start = time.thread_time()
        out = inputs
        for layer in ordered:
            out = layer(out)
        loss = model.loss(out, targets).float()
        mid = time.thread_time()
        time.sleep(_sleep_before(factor, backward_s))
        back = time.thread_time()
        loss.backward()
        end = time.thread_time()
        for layer in ordered:
            layer.zero_grad(set_to_none=True)
        if run > 0:
            forward_s.append(mid - start)
            backward_s.append(end - back)
    fwd, bwd = min(forward_s), min(backward_s)
    return InContextRatio(
        forward=fwd / sum(layers_forward_cpu_s),
        backward=bwd / sum(layers_backward_cpu_s),
        forward_cpu_s=fwd,
        backward_cpu_s=bwd,
    )


def _sleep_before(factor: float, seen_cpu_s: list[float]) -> float:
    """The stretch's sleep after the previous call of this kind: ``(factor - 1) x`` its CPU time."""
    last = seen_cpu_s[-1] if seen_cpu_s else 0.01
    return min(MAX_SLEEP_S, (factor - 1.0) * last)

"""Per-call fixed cost of a stage's compute: runs of k consecutive layers timed as one call.

A running rank computes its stage, per microbatch, as one forward call over all of its layers and
one backward call (``worker/pipeline.py``). The per-layer profile (``worker/profiler.py``) times
each layer as a call of its own, so whatever a call costs whatever it holds (entering the
autograd engine for the backward, allocating the output and its gradient buffers, the dispatch
around the first and the last op) is in every layer's figure once, while a stage of ``n`` layers
pays it once.

:func:`measure_call_overhead` times chains of ``k`` consecutive transformer blocks (alike, so
only ``k`` changes) as the runtime runs a middle stage: the forward as one call over the chain
from a received activation that requires grad, the backward as one call from a gradient already
at hand. A straight line through the ``(k, seconds)`` points, by least squares, separates the
per-layer cost (slope) from the per-call cost (intercept), for the forward and the backward.

Emulation (``worker/emulation.py``): the stretch pads each call to ``factor x`` the least thread
CPU time seen for that call, so under emulation a call's cost is ``factor x`` its least CPU time
and the per-call cost is ``factor x`` the CPU-time intercept; the chains are timed by that rule
(least thread CPU time over the repeats, times the factor), as the per-layer profile is. On a
real device: the median wall time, synchronised. An intercept is recorded only where it stands
out of the points' scatter (positive and at least twice its standard error, :func:`call_intercept`):
a negative one (a long chain slower per layer than a short one, its working set outgrowing a
cache) is no per-call cost, and one within the scatter, netted out of every layer of a stage,
would move the stage's time by the scatter times its layers. Either is recorded as 0, and the
cost model then sums the layers as profiled.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from orchestrator.worker.model_api import LayeredModel


@dataclass(frozen=True)
class CallOverhead:
    """Seconds one forward and one backward call cost beyond the layers they hold."""

    forward_s: float
    backward_s: float
    # The points the lines went through: (layers in the call, forward s, backward s).
    points: tuple[tuple[int, float, float], ...]


def chain_lengths(num_blocks: int) -> tuple[int, ...]:
    """k = 1, then doubling, then every block: few points spread over the range a stage spans."""
    ks = [1]
    while ks[-1] * 2 <= num_blocks:
        ks.append(ks[-1] * 2)
    if ks[-1] != num_blocks:
        ks.append(num_blocks)
    return tuple(ks)


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) through ``(x, y)`` points (at least two distinct x)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        raise ValueError("a line needs points at two different x")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    return mean_y - slope * mean_x, slope


def intercept_standard_error(points: Sequence[tuple[float, float]]) -> float:
    """Standard error of the least-squares intercept (inf with two points: no residual left)."""
    n = len(points)
    if n <= 2:
        return float("inf")
    intercept, slope = fit_line(points)
    mean_x = sum(x for x, _ in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    residual = sum((y - intercept - slope * x) ** 2 for x, y in points) / (n - 2)
    return float((residual * (1 / n + mean_x**2 / sxx)) ** 0.5)


def call_intercept(points: Sequence[tuple[float, float]]) -> float:
    """The per-call seconds a line through ``(layers, seconds)`` points shows: its intercept
    where it is positive and at least twice its standard error, else 0 (a per-call cost the
    points cannot tell from their own scatter is not charged: multiplied by the layers it is
    netted out of, the scatter would move a stage's time more than the cost itself)."""
    intercept, _ = fit_line(points)
    if intercept <= 0 or intercept < 2 * intercept_standard_error(points):
        return 0.0
    return intercept


def measure_call_overhead(
    model: LayeredModel,
    layers: dict[int, nn.Module],
    inputs: torch.Tensor,
    slowdown_factor: float,
    warmup: int = 2,
    repeats: int = 9,
) -> CallOverhead | None:
    """Fit the per-call forward and backward seconds (see module docstring); None when the model
    has fewer than two blocks (no line to fit)."""
    blocks = list(range(1, model.num_planner_layers - 1))
    if len(blocks) < 2:
        return None
    device = inputs.device
    emulated = slowdown_factor != 1.0
    clock = time.thread_time if emulated else time.perf_counter
    pick: Callable[[list[float]], float] = min if emulated else statistics.median
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        received = layers[0](inputs)  # what a middle stage receives: the embedding's output
    grad = torch.ones_like(received)  # its gradient arrives with the same shape
    ks = chain_lengths(len(blocks))
    forward: dict[int, list[float]] = {k: [] for k in ks}
    backward: dict[int, list[float]] = {k: [] for k in ks}
    for run in range(warmup + repeats):
        for k in ks:  # round-robin, so a busy moment of the host touches every k alike
            x = received.detach().requires_grad_(True)
            chain = [layers[i] for i in blocks[:k]]
            sync()
            start = clock()
            out = x
            for layer in chain:
                out = layer(out)
            sync()
            mid = clock()
            out.backward(grad)
            sync()
            end = clock()
            for layer in chain:
                layer.zero_grad(set_to_none=True)
            if run >= warmup:
                forward[k].append(mid - start)
                backward[k].append(end - mid)
    points = tuple(
        (k, slowdown_factor * pick(forward[k]), slowdown_factor * pick(backward[k])) for k in ks
    )
    forward_call = call_intercept([(k, f) for k, f, _ in points])
    backward_call = call_intercept([(k, b) for k, _, b in points])
    return CallOverhead(forward_call, backward_call, points)

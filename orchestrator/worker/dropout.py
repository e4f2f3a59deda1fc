"""Dropout that every plan reproduces: randomness seeded per (step, layer, sample).

A plan decides which samples share a microbatch and which layers share a stage, so dropout masks
drawn from one random stream per process would differ between plans. Here a layer that wants
dropout runs each sample of its microbatch under its own generator state, seeded from
``(seed, step, planner layer, global sample index)``: the same sample at the same step in the
same layer gets the same mask whatever the plan. Backward reuses the masks autograd saved.

The engine (and the single-process reference) opens :func:`sample_streams` around a step's
forwards. Every stage runs its microbatches' forwards in microbatch order (GPipe and 1F1B
alike), so the ``k``-th forward of a layer within a step is microbatch ``k``; that gives each row
its global sample index.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class _Streams:
    seed: int
    step: int
    starts: list[int]  # global index of each microbatch's first sample
    sizes: list[int]
    forwards: dict[int, int] = field(default_factory=dict)  # layer -> forwards seen this step


_CURRENT: contextvars.ContextVar[_Streams | None] = contextvars.ContextVar(
    "sample_streams", default=None
)


@contextmanager
def sample_streams(seed: int, step: int, first_sample: int, sizes: Sequence[int]) -> Iterator[None]:
    """Within this block, layer forwards draw their randomness per sample (see above)."""
    starts, at = [], first_sample
    for size in sizes:
        starts.append(at)
        at += size
    token = _CURRENT.set(_Streams(seed, step, starts, list(sizes)))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def sample_seed(seed: int, step: int, layer: int, sample: int) -> int:
    """A 63-bit seed of (seed, step, layer, sample); distinct tuples give distinct streams."""
    value = 0x9E3779B97F4A7C15
    for part in (seed, step, layer, sample):
        value = (value ^ (part + 0x632BE59BD9B4E019)) * 0xBF58476D1CE4E5B9 % (1 << 64)
    return value >> 1


def seeded_forward(module: torch.nn.Module, layer: int, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` with each row's randomness seeded by its sample; plain without streams."""
    streams = _CURRENT.get()
    if streams is None or not module.training:
        return module(x)  # type: ignore[no-any-return]
    k = streams.forwards.get(layer, 0)
    streams.forwards[layer] = k + 1
    if k >= len(streams.sizes) or streams.sizes[k] != x.shape[0]:
        raise RuntimeError(
            f"layer {layer}: forward {k} of the step has {x.shape[0]} samples, the schedule's "
            f"microbatches are {streams.sizes}"
        )
    devices = [x.device] if x.device.type == "cuda" else []
    rows = []
    for i in range(x.shape[0]):
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(sample_seed(streams.seed, streams.step, layer, streams.starts[k] + i))
            rows.append(module(x[i : i + 1]))
    return torch.cat(rows)


@dataclass(frozen=True)
class Position:
    """Where a step's streams stood before one forward (see :func:`replaying`)."""

    streams: _Streams
    forwards: dict[int, int]


def forward_position() -> Position | None:
    """The step's streams and how many forwards each layer has run (None outside
    :func:`sample_streams`)."""
    streams = _CURRENT.get()
    return None if streams is None else Position(streams, dict(streams.forwards))


@contextmanager
def replaying(position: Position | None) -> Iterator[None]:
    """Run a forward again at an earlier ``position`` (activation recompute): it draws the masks
    the original forward drew and leaves the step's counts as they were. The streams are set
    again explicitly: the backward that recomputes may run on another thread (CUDA's autograd
    threads), where the step's context is not current."""
    if position is None:
        yield
        return
    streams = position.streams
    saved = streams.forwards
    streams.forwards = dict(position.forwards)
    token = _CURRENT.set(streams)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        streams.forwards = saved

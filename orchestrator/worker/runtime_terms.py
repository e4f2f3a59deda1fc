"""Fixed per-step terms of our runtime, measured through the runtime's own stage runner.

The per-layer profile (``worker/profiler.py``) times each layer's forward, backward and update on
its own. A running rank does more per step than those pieces: for each microbatch it schedules
the pieces, splits the batch, reads the loss back, keeps activations for the backward and, when
emulating a slower device, wakes up from the stretch's sleep a little late (the wake-up is
scheduler latency, longer on a busy host); once per step it clears gradients and runs the
optimizer loop. None of that is inside a timed piece, so none of it is in the layer profile.

:func:`measure_runtime_terms` runs the whole model as one pipeline stage through
:class:`~orchestrator.worker.pipeline.PipelineRunner` (the code a rank runs; a one-stage
pipeline needs no transfers, so no process group) with the same :class:`Stretcher` the rank
uses, for ``m = 1`` and ``m = M`` microbatches, and measures, per step, the wall time *outside*
the stretched pieces: ``outside(m) = wall(m) - sum of pieces``. A straight line through the two
points separates the term paid per microbatch (its slope) from the one paid per step (its value
at ``m = 0``). Each point is the median over repeats, so a busy host's outliers stay out; both
are differences of wall clocks taken around the same pieces, not of two separately profiled
figures, so the large stretched times cancel exactly.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from orchestrator.worker.emulation import Stretcher
from orchestrator.worker.model_api import LayeredModel
from orchestrator.worker.optim import make_optimizer
from orchestrator.worker.pipeline import PipelineRunner
from orchestrator.worker.topology import RankSpec


@dataclass(frozen=True)
class RuntimeTerms:
    """Seconds a rank spends outside its timed compute: per microbatch and per step."""

    microbatch_overhead_s: float
    step_overhead_s: float
    # The medians the line went through: (microbatches, seconds outside the pieces per step).
    points: tuple[tuple[int, float], ...]


def measure_runtime_terms(
    model: LayeredModel,
    layers: dict[int, nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    microbatch_size: int,
    slowdown_factor: float,
    optimizer_name: str,
    many: int = 6,
    warmup: int = 1,
    repeats: int = 5,
) -> RuntimeTerms:
    """Per-microbatch and per-step seconds outside the stretched pieces (see module docstring).

    ``inputs``/``targets`` hold at least ``many * microbatch_size`` samples.
    """
    if many < 2:
        raise ValueError("many must be at least 2 (two points make the line)")
    device = inputs.device
    order = sorted(layers)
    stretcher = Stretcher(slowdown_factor)
    spec = RankSpec(
        rank=0,
        replica=0,
        stage=0,
        num_stages=1,
        device_type="profiled",
        layers=(order[0], order[-1] + 1),
        node=None,
        prev_rank=None,
        next_rank=None,
        replica_batch_size=many * microbatch_size,
        replica_sample_offset=0,
    )
    runner = PipelineRunner(
        spec=spec,
        layers=[layers[i] for i in order],
        model=model,
        device=device,
        stretcher=stretcher,
        sync_each=stretcher.emulated or device.type == "cuda",
    )
    optimizers = [make_optimizer(optimizer_name, layers[i].parameters(), 1e-6) for i in order]

    def update() -> None:
        for opt in optimizers:
            opt.step()

    def outside_s(m: int) -> float:
        """Seconds of one m-microbatch step spent outside the stretched pieces."""
        samples = m * microbatch_size
        batch, labels = inputs[:samples], targets[:samples]
        stretcher.reset()
        start = time.perf_counter()
        for layer in layers.values():  # as the engine does at the start of each step
            layer.zero_grad(set_to_none=True)
        runner.run("1f1b", [microbatch_size] * m, [1.0 / samples] * m, batch, labels)
        stretcher.run(update, _sync_fn(device), key="update")
        wall_s = time.perf_counter() - start
        return max(0.0, wall_s - stretcher.compute_s)

    points = []
    for m in (1, many):
        # Warm-up runs also set the stretch's reference CPU times for this microbatch size.
        for _ in range(warmup):
            outside_s(m)
        points.append((m, statistics.median(outside_s(m) for _ in range(repeats))))
    (m1, o1), (m2, o2) = points
    per_microbatch_s = max(0.0, (o2 - o1) / (m2 - m1))
    per_step_s = max(0.0, o1 - per_microbatch_s * m1)
    for layer in layers.values():
        layer.zero_grad(set_to_none=True)
    return RuntimeTerms(per_microbatch_s, per_step_s, tuple(points))


def _sync_fn(device: torch.device):  # type: ignore[no-untyped-def]
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None

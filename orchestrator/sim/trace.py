"""Failure traces: unexpected interruptions as a Poisson process over the GPUs of a cluster.

Meta's Llama 3 report (Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.4) counts 419
unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs. Read as a
constant rate per GPU, that is one interruption per 16,384 * 54 * 86,400 / 419 GPU-seconds; a
cluster of ``n`` GPUs sees ``n`` times the per-GPU rate. Each interruption takes one node (its
host and all its GPUs) out of the cluster.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
SECONDS_PER_DAY = 86_400.0


def llama3_rate_per_gpu_s(harshness: float = 1.0) -> float:
    """Interruptions per GPU-second at Llama 3's reported rate, times ``harshness``."""
    return harshness * LLAMA3_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_DAYS * SECONDS_PER_DAY)


@dataclass(frozen=True)
class FailureTrace:
    """Interruption times (seconds from the start of the run), ascending, within ``horizon_s``.

    ``seed`` also seeds which node each interruption hits (see ``world.SimCluster``).
    """

    times_s: tuple[float, ...]
    horizon_s: float
    rate_per_s: float
    seed: int

    @property
    def expected_failures(self) -> float:
        return self.rate_per_s * self.horizon_s


def poisson_trace(rate_per_s: float, horizon_s: float, seed: int) -> FailureTrace:
    """Exponential gaps at ``rate_per_s`` (cluster-wide) until ``horizon_s``; deterministic in
    ``seed``."""
    rng = random.Random(seed)
    times: list[float] = []
    t = 0.0
    while rate_per_s > 0:
        t += rng.expovariate(rate_per_s)
        if t >= horizon_s:
            break
        times.append(t)
    return FailureTrace(tuple(times), horizon_s, rate_per_s, seed)


def empty_trace(horizon_s: float) -> FailureTrace:
    """No failures: the reference run that goodput is measured against."""
    return FailureTrace((), horizon_s, 0.0, 0)

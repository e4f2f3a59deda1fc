"""Per-collective cost of the layer-by-layer sharded path's gathers and reductions on gloo.

``worker/layerwise.py`` issues, every microbatch round, one ``broadcast`` per owner's slice
that meets a layer (its gathers: an empty buffer, the owner's copy of its slice into it, the
broadcast) and one ``reduce`` per such slice (a zeroed gradient buffer, the reduce, the owner's
add into its gradient slice). Each pays a fixed latency (gloo's rounds between the ranks, the
TCP round through the kernel, the work's completion) and its bytes at the rate gloo moves them
between processes, besides the buffer work on the rank's own core.
:func:`measure_collective_cost` starts ``ranks`` processes on this node (``spawn``, one torch
thread each) that form a gloo group and time sequences of these collectives back to back as the
path issues them (gathers, then reductions, owners rotating), at 64 KiB and at 1 MiB pieces,
and fits ``seconds = latency + bytes / rate`` per collective to the medians, one line each for
gathers and reductions (gloo's ``reduce`` among 3 or more ranks costs several times its
``broadcast`` at these sizes). Back to back, not one at a time between barriers: each
collective then also waits for the ranks the previous one left behind (a broadcast's root is
done before its receivers), which costs more per collective on this host
(``bench/sharded_collectives.py``). Gloo only, as ``worker/p2p_latency.py``: on a GPU node the
runtime's collectives are NCCL's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from orchestrator.worker.p2p_latency import run_local_ranks

SMALL_NUMEL, LARGE_NUMEL = 1 << 14, 1 << 18  # fp32 numbers: 64 KiB and 1 MiB
OPS = ("gather", "reduce")


def _time_patterns(
    rank: int, ranks: int, port: int, warmup: int, repeats: int, results: Any
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    try:
        medians: dict[tuple[str, int], float] = {}
        count = 2 * ranks  # collectives per timed sequence
        for numel in (SMALL_NUMEL, LARGE_NUMEL):
            mine = torch.ones(numel)
            summed = torch.zeros(numel)
            for op in OPS:
                times = []
                for _ in range(warmup + repeats):
                    dist.barrier()
                    start = time.perf_counter()
                    # Back to back, owners rotating, as the path issues them: each collective
                    # also waits for the ranks the previous one left behind.
                    for j in range(count):
                        owner = j % ranks
                        if op == "gather":
                            buf = torch.empty(numel)
                            if owner == rank:
                                buf.copy_(mine)
                            dist.broadcast(buf, src=owner)
                        else:
                            buf = torch.zeros(numel)
                            dist.reduce(buf, dst=owner)
                            if owner == rank:
                                summed += buf
                    times.append((time.perf_counter() - start) / count)
                medians[(op, numel)] = statistics.median(times[warmup:])
        if rank == 0:
            results.put(medians)
    finally:
        dist.destroy_process_group()


def fit_cost(small_s: float, large_s: float) -> tuple[float, float]:
    """(latency seconds, bytes per second) of the line through the seconds of one collective
    at ``SMALL_NUMEL`` and at ``LARGE_NUMEL`` fp32 numbers."""
    per_byte = max(large_s - small_s, 1e-12) / (4 * (LARGE_NUMEL - SMALL_NUMEL))
    return max(small_s - 4 * SMALL_NUMEL * per_byte, 0.0), 1.0 / per_byte


@dataclass(frozen=True)
class CollectiveCost:
    """Measured ``latency + bytes / rate`` of the path's two collectives."""

    gather_latency_s: float
    gather_bytes_per_s: float
    reduce_latency_s: float
    reduce_bytes_per_s: float


def measure_collective_cost(
    ranks: int = 2, warmup: int = 3, repeats: int = 20, timeout_s: float = 120.0
) -> CollectiveCost:
    """The cost of one gloo gather and of one reduction of the layer-by-layer path among
    ``ranks`` local ranks (see module docstring). Raises ``RuntimeError`` when the processes
    fail or outlast ``timeout_s``."""
    medians = run_local_ranks(
        _time_patterns, ranks, (warmup, repeats), timeout_s, "gloo collective"
    )
    gather = fit_cost(medians[("gather", SMALL_NUMEL)], medians[("gather", LARGE_NUMEL)])
    reduce = fit_cost(medians[("reduce", SMALL_NUMEL)], medians[("reduce", LARGE_NUMEL)])
    return CollectiveCost(*gather, *reduce)

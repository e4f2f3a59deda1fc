"""Per-collective cost of our runtime's gloo collectives: the layer-by-layer sharded path's
gathers and reductions, and the data-parallel all-reduce.

``worker/layerwise.py`` issues, every microbatch round, one ``broadcast`` per owner's slice
that meets a layer (its gathers: an empty buffer, the owner's copy of its slice into it, the
broadcast) and one ``reduce`` per such slice (a zeroed gradient buffer, the reduce, the owner's
add into its gradient slice); the once-a-step sharded path gathers its updated slices with the
same ``broadcast`` per slice (``worker/sharding.py``). The gradient all-reduce sums a flat
buffer of a bucket's gradients (``worker/grad_sync.py``, ``worker/groups.py``). Each pays a
fixed latency (gloo's rounds between the ranks, the TCP round through the kernel, the work's
completion) and its bytes at the rate gloo moves them between processes, besides the buffer
work on the rank's own core.

:func:`measure_collective_cost` starts ``ranks`` processes on this node (``spawn``, one torch
thread each) that form a gloo group and time sequences of each collective back to back as the
runtime issues them (owners rotating), and fits ``seconds = latency + bytes / rate`` per
collective, one line each for gathers, reductions and all-reduces (gloo's ``reduce`` among 3
or more ranks costs several times its ``broadcast`` at these sizes). Back to back, not one at a
time between barriers: each collective then also waits for the ranks the previous one left
behind (a broadcast's root is done before its receivers), which costs more per collective on
this host (``bench/sharded_collectives.py``).

The pieces are timed at four sizes from 64 KiB to 4 MiB (slices of layers and buckets are a
few hundred KiB to a few MiB), interleaved repeat by repeat so that a change in the host's load
falls on every size alike, and the line is the least-squares one through the four medians. Two
sizes up to 1 MiB, where the latency dominates, left the rate to the noise: five profiles in a
row on an idle host fitted a reduction's rate anywhere from 0.47 to 38.9 GB/s (0.85-1.19 GB/s
over the four sizes), and the planner's choice between sharded paths moved with it.

Gloo only, as ``worker/p2p_latency.py``: on a GPU node the runtime's collectives are NCCL's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.worker.p2p_latency import run_local_ranks

# fp32 numbers: 64 KiB, 256 KiB, 1 MiB and 4 MiB pieces
NUMELS = (1 << 14, 1 << 16, 1 << 18, 1 << 20)
OPS = ("gather", "reduce", "all_reduce")


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
        count = 2 * ranks  # collectives per timed sequence
        mine = {numel: torch.ones(numel) for numel in NUMELS}
        summed = {numel: torch.zeros(numel) for numel in NUMELS}
        times: dict[tuple[str, int], list[float]] = {(op, n): [] for op in OPS for n in NUMELS}
        for _ in range(warmup + repeats):
            for numel in NUMELS:  # every size each repeat: the host's drift falls on all alike
                for op in OPS:
                    dist.barrier()
                    start = time.perf_counter()
                    # Back to back, owners rotating, as the path issues them: each collective
                    # also waits for the ranks the previous one left behind.
                    for j in range(count):
                        run_collective(op, j % ranks, rank, mine[numel], summed[numel])
                    times[(op, numel)].append((time.perf_counter() - start) / count)
        if rank == 0:
            results.put({key: statistics.median(t[warmup:]) for key, t in times.items()})
    finally:
        dist.destroy_process_group()


def run_collective(op: str, owner: int, rank: int, mine: Any, summed: Any) -> None:
    """One collective of ``op`` (one of :data:`OPS`) as the runtime issues it, with its buffer
    work: a gather of ``owner``'s slice ``mine`` (an empty buffer, the owner's copy into it, a
    ``broadcast``), a reduction into the owner's ``summed`` (a zeroed buffer, ``reduce``, the
    owner's add), or a bucket's all-reduce (flattened, summed, read back into ``summed``)."""
    import torch
    import torch.distributed as dist

    if op == "gather":
        buf = torch.empty_like(mine)
        if owner == rank:
            buf.copy_(mine)
        dist.broadcast(buf, src=owner)
    elif op == "reduce":
        buf = torch.zeros_like(mine)
        dist.reduce(buf, dst=owner)
        if owner == rank:
            summed += buf
    else:
        buf = torch.cat([mine])
        dist.all_reduce(buf)
        summed.copy_(buf)


def fit_cost(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(latency seconds, bytes per second) of the least-squares line through ``points``, each
    (bytes, seconds of one collective at that size); two or more distinct sizes. A slope that
    noise makes zero or negative reads as a very fast rate, a negative intercept as no
    latency."""
    sizes = [b for b, _ in points]
    if len(set(sizes)) < 2:
        raise ValueError("fit_cost needs two or more distinct sizes")
    mean_b = statistics.fmean(sizes)
    mean_s = statistics.fmean(s for _, s in points)
    var = sum((b - mean_b) ** 2 for b in sizes)
    per_byte = sum((b - mean_b) * (s - mean_s) for b, s in points) / var
    per_byte = max(per_byte, 1e-12)
    return max(mean_s - per_byte * mean_b, 0.0), 1.0 / per_byte


@dataclass(frozen=True)
class CollectiveCost:
    """Measured ``latency + bytes / rate`` of a gather, a reduction and an all-reduce."""

    gather_latency_s: float
    gather_bytes_per_s: float
    reduce_latency_s: float
    reduce_bytes_per_s: float
    allreduce_latency_s: float
    allreduce_bytes_per_s: float


def measure_collective_cost(
    ranks: int = 2, warmup: int = 3, repeats: int = 20, timeout_s: float = 120.0
) -> CollectiveCost:
    """The cost of one gloo gather, one reduction and one all-reduce as our runtime issues them
    among ``ranks`` local ranks (see module docstring). Raises ``RuntimeError`` when the processes
    fail or outlast ``timeout_s``."""
    medians = run_local_ranks(
        _time_patterns, ranks, (warmup, repeats), timeout_s, "gloo collective"
    )
    gather, reduce, allreduce = (
        fit_cost([(4 * n, medians[(op, n)]) for n in NUMELS]) for op in OPS
    )
    return CollectiveCost(*gather, *reduce, *allreduce)

"""Per-collective cost of the layer-by-layer sharded path's gathers and reductions on gloo.

``worker/layerwise.py`` issues, every microbatch round, one ``broadcast`` per owner's slice
that meets a layer (its gathers: an empty buffer, the owner's copy of its slice into it, the
broadcast) and one ``reduce`` per such slice (a zeroed gradient buffer, the reduce, the owner's
add into its gradient slice). Each pays a fixed latency (gloo's rounds between the ranks, the
TCP round through the kernel, the work's completion) and its bytes at the rate gloo moves them
between processes, besides the buffer work on the rank's own core.
:func:`measure_collective_cost` starts ``ranks`` processes on this node (``spawn``, one torch
thread each) that form a gloo group and time both patterns as the path runs them, at a tiny and
at a large message, and fits ``seconds = latency + bytes / rate`` to the medians (gathers and
reductions pooled: they cost alike on gloo). Gloo only, as ``worker/p2p_latency.py``: on a GPU
node the runtime's collectives are NCCL's.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from typing import Any

from orchestrator.worker.p2p_latency import _free_port

SMALL_NUMEL, LARGE_NUMEL = 1, 1 << 18  # fp32 numbers: 4 bytes and 1 MiB


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
        for numel in (SMALL_NUMEL, LARGE_NUMEL):
            mine = torch.ones(numel)
            summed = torch.zeros(numel)
            for op in ("gather", "reduce"):
                times = []
                for i in range(warmup + repeats):
                    owner = i % ranks
                    dist.barrier()
                    start = time.perf_counter()
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
                    times.append(time.perf_counter() - start)
                medians[(op, numel)] = statistics.median(times[warmup:])
        if rank == 0:
            results.put(medians)
    finally:
        dist.destroy_process_group()


def fit_cost(medians: dict[tuple[str, int], float]) -> tuple[float, float]:
    """(latency seconds, bytes per second) of the line through the pooled small and large
    medians (fp32 numbers of ``SMALL_NUMEL`` and ``LARGE_NUMEL``)."""
    small = statistics.fmean(medians[(op, SMALL_NUMEL)] for op in ("gather", "reduce"))
    large = statistics.fmean(medians[(op, LARGE_NUMEL)] for op in ("gather", "reduce"))
    per_byte = max(large - small, 1e-12) / (4 * (LARGE_NUMEL - SMALL_NUMEL))
    return max(small - 4 * SMALL_NUMEL * per_byte, 0.0), 1.0 / per_byte


def measure_collective_cost(
    ranks: int = 2, warmup: int = 5, repeats: int = 30, timeout_s: float = 120.0
) -> tuple[float, float]:
    """(latency seconds, bytes per second) of one gloo gather or reduction of the layer-by-layer
    path among ``ranks`` local ranks (see module docstring). Raises ``RuntimeError`` when the
    processes fail or outlast ``timeout_s``."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_time_patterns,
            args=(rank, ranks, port, warmup, repeats, results),
            daemon=True,
        )
        for rank in range(ranks)
    ]
    for p in procs:
        p.start()
    try:
        medians = results.get(timeout=timeout_s)
    except Exception as exc:  # queue.Empty, or a child that died before replying
        raise RuntimeError(f"gloo collective measurement failed: {exc!r}") from exc
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return fit_cost(medians)

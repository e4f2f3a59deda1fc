"""Per-message latency of a gloo point-to-point transfer between two ranks on this node.

A stage boundary moves each microbatch's activation forward and its gradient back as one
``batch_isend_irecv`` per exchange (``worker/p2p.py``). Besides its bytes over the link, each
message pays a fixed latency (gloo's pair handshake, the TCP round through the kernel, the
request's completion): :func:`measure_p2p_latency_s` starts two processes on this node that
form a gloo group and bounce a 4-byte tensor back and forth through ``batch_isend_irecv``; the
latency is half the median round trip. Two fresh processes (``spawn``) keep the caller's own
process free of any process group. Gloo only: on a GPU node the runtime's transfers are NCCL's,
which two local ranks need two GPUs to measure.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import statistics
import time
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bounce(rank: int, world: int, port: int, warmup: int, repeats: int, results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        peer = 1 - rank
        tensor = torch.zeros(1, dtype=torch.float32)
        rounds = []
        for i in range(warmup + repeats):
            start = time.perf_counter()
            if rank == 0:
                ops = [dist.P2POp(dist.isend, tensor, peer)]
            else:
                ops = [dist.P2POp(dist.irecv, tensor, peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            if rank == 0:
                ops = [dist.P2POp(dist.irecv, tensor, peer)]
            else:
                ops = [dist.P2POp(dist.isend, tensor, peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            if i >= warmup:
                rounds.append(time.perf_counter() - start)
        if rank == 0:
            results.put(statistics.median(rounds) / 2)
    finally:
        dist.destroy_process_group()


def measure_p2p_latency_s(warmup: int = 10, repeats: int = 100, timeout_s: float = 60.0) -> float:
    """Seconds of one gloo point-to-point message between two local ranks (see module
    docstring). Raises ``RuntimeError`` when the two processes fail or outlast ``timeout_s``."""
    reply = run_local_ranks(_bounce, 2, (warmup, repeats), timeout_s, "gloo latency")
    return float(reply)


def run_local_ranks(
    target: Any, ranks: int, args: tuple[Any, ...], timeout_s: float, what: str
) -> Any:
    """Start ``ranks`` spawned processes ``target(rank, world, port, *args, results)`` that
    form a gloo group on a free local port; the first reply put on ``results``. Raises
    ``RuntimeError`` naming ``what`` when they fail or outlast ``timeout_s``."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=target, args=(rank, ranks, port, *args, results), daemon=True)
        for rank in range(ranks)
    ]
    for p in procs:
        p.start()
    try:
        return results.get(timeout=timeout_s)
    except Exception as exc:  # queue.Empty, or a child that died before replying
        raise RuntimeError(f"{what} measurement failed: {exc!r}") from exc
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()

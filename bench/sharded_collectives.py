"""The layer-by-layer sharded path's collectives alone, timed on gloo over this host's loopback.

``k`` processes (one torch thread each, no Ray, no model) form a gloo group and time:

- one ``broadcast`` and one ``reduce`` (the two collectives of ``worker/layerwise.py``) of
  1 to 2**20 fp32 numbers, median of ``--repeats`` after a warm-up, and the straight-line fit
  ``seconds = latency + bytes / bandwidth`` of each;
- the collectives of one layer-by-layer step of ``bench/sharded_emulated.py``'s model (the GPT of
  2 blocks, hidden 128, vocabulary 8,192, sequence 64, fp32), ``--rounds`` rounds at ``--level``
  over ``k`` holders' flat slices, with the copies the hooks make (the owner's slice into the
  gathered buffer, the reduced piece into its gradient slice), as the runtime issues them, and
  what the cost model charges for them.

Nothing passes or fails; the figures go to docs/benchmarks.md.

Run: .venv/bin/python bench/sharded_collectives.py [--ranks 4] [--rounds 3] [--level full]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from orchestrator.costmodel import sharding

SIZES = [1, 1024, 16384, 65536, 262144, 1048576]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _segments(layer_numels: list[int], k: int) -> list[list[tuple[int, int]]]:
    """Per layer, (owner, numel) of each owner's slice that meets it (worker/layerwise.py)."""
    from orchestrator.worker.topology import shard_bounds

    bounds = shard_bounds(sum(layer_numels), k)
    out, start = [], 0
    for n in layer_numels:
        end = start + n
        out.append(
            [
                (o, min(hi, end) - max(lo, start))
                for o, (lo, hi) in enumerate(bounds)
                if max(lo, start) < min(hi, end)
            ]
        )
        start = end
    return out


def _worker(rank: int, k: int, port: int, args: Any, numels: list[int], results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=k)
    try:
        single: dict[tuple[str, int], float] = {}
        for n in SIZES:
            t = torch.ones(n)
            for op in ("broadcast", "reduce"):
                times = []
                for i in range(args.warmup + args.repeats):
                    dist.barrier()
                    start = time.perf_counter()
                    if op == "broadcast":
                        dist.broadcast(t, src=i % k)
                    else:
                        dist.reduce(t, dst=i % k)
                    times.append(time.perf_counter() - start)
                single[(op, n)] = statistics.median(times[args.warmup :])
        segments = _segments(numels, k)
        full = args.level == "full"
        master = torch.ones(max(sum(numels) // k + 1, 1))
        grad_slice = torch.zeros_like(master)
        steps = []
        for _ in range(args.warmup + args.steps):
            dist.barrier()
            start = time.perf_counter()
            count = 0
            for _r in range(args.rounds):
                order = [("g", i) for i in range(len(numels))] if full else []
                for i in reversed(range(len(numels))):
                    order += ([("g", i)] if full else []) + [("r", i)]
                for op, i in order:
                    buf = (torch.empty if op == "g" else torch.zeros)(numels[i])
                    at = 0
                    for owner, n in segments[i]:
                        piece = buf[at : at + n]
                        if op == "g":
                            if owner == rank:
                                piece.copy_(master[:n])
                            dist.broadcast(piece, src=owner)
                        else:
                            dist.reduce(piece, dst=owner)
                            if owner == rank:
                                grad_slice[:n] += piece
                        at += n
                        count += 1
            steps.append(time.perf_counter() - start)
        if rank == 0:
            results.put((single, statistics.median(steps[args.warmup :]), count))
    finally:
        dist.destroy_process_group()


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept seconds, bytes per second) of seconds against bytes."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, 1 / slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--level", choices=["full", "gradients"], default="full")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    import sharded_emulated as se

    model = se.SHAPE
    numels = [model.layer_params(i) for i in range(model.num_planner_layers)]
    k = args.ranks
    print(f"load average at start: {os.getloadavg()} on {os.cpu_count()} cores")
    print(f"gloo, {k} ranks on this host (loopback), 1 torch thread each; layers {numels}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _port()
    procs = [
        ctx.Process(target=_worker, args=(r, k, port, args, numels, results), daemon=True)
        for r in range(k)
    ]
    for p in procs:
        p.start()
    single, step_s, count = results.get(timeout=600)
    for p in procs:
        p.join(timeout=10)
    for op in ("broadcast", "reduce"):
        row = "  ".join(f"{n}:{single[(op, n)] * 1e3:.3f}" for n in SIZES)
        latency, bandwidth = _fit([(n * 4.0, single[(op, n)]) for n in SIZES])
        print(f"{op:<9} ms by fp32 count  {row}")
        print(f"{'':<9} fit: {latency * 1e3:.3f} ms + bytes / {bandwidth / 1e9:.3f} GB/s")
    print(
        f"{args.level} step of {args.rounds} rounds: {count} collectives, {step_s * 1e3:.1f} ms"
        f" ({step_s / count * 1e3:.3f} ms each)"
    )
    from orchestrator.worker.collective_cost import measure_collective_cost

    cost = measure_collective_cost(ranks=k)
    gather = (cost.gather_latency_s, cost.gather_bytes_per_s)
    reduce = (cost.reduce_latency_s, cost.reduce_bytes_per_s)
    print(
        f"profiler's fits (worker/collective_cost.py, back to back): gather"
        f" {gather[0] * 1e3:.3f} ms + bytes / {gather[1] / 1e9:.3f} GB/s, reduce"
        f" {reduce[0] * 1e3:.3f} ms + bytes / {reduce[1] / 1e9:.3f} GB/s"
    )
    pieces = [n for layer in _segments(numels, k) for _, n in layer]
    level = sharding_level(args.level)
    charged = sharding.layerwise_collectives_s(numels, 4, 4, level, k, args.rounds, gather, reduce)
    print(
        f"cost model for the step above: {charged * 1e3:.1f} ms ({len(pieces)} pieces a layer set)"
    )
    print(f"load average at end: {os.getloadavg()}")


def sharding_level(name: str) -> Any:
    from orchestrator.spec.plan import Sharding

    return Sharding(name)


if __name__ == "__main__":
    main()

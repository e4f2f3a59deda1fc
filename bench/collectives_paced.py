"""A gloo collective after emulated compute against the same collective back to back.

The profiler fits each collective of the layer-by-layer sharded path back to back
(``worker/collective_cost.py``). In a run, each follows a segment of emulated compute: real CPU
work paced to ``factor x`` its least CPU time (``worker/emulation.Stretcher``). This bench times
both among ``--ranks`` gloo processes on this host (one torch thread each, no Ray, no model):
per repeat, one stretched call of ``--collectives`` segments, each a ``--matrix``-square matmul
(or, with ``--matrix 0``, a sleep of ``--gap-ms``) followed by a collective under
``Stretcher.aside`` (two broadcasts then a reduce, owners rotating, as the path issues them),
then the same collectives back to back. It prints, per rank, the median wall time of one
collective each way, and the segment's least CPU time. The ranks share their reference times
(``SharedReferences``), as the runtime's sharded holders do, so every rank's segment lasts the
same emulated time.

Nothing passes or fails; the figures go to docs/benchmarks.md.

Run: .venv/bin/python bench/collectives_paced.py [--ranks 4] [--factor 4] [--matrix 384]
     [--numel 262144] [--gap-ms 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from orchestrator.worker.emulation import SHARED_REFERENCES_ENV
from orchestrator.worker.p2p_latency import run_local_ranks

WARMUP = 3


def _ranks(
    rank: int,
    ranks: int,
    port: int,
    factor: float,
    collectives: int,
    numel: int,
    matrix: int,
    gap_s: float,
    repeats: int,
    results: Any,
) -> None:
    import torch
    import torch.distributed as dist

    from orchestrator.worker.collective_cost import run_collective
    from orchestrator.worker.emulation import SharedReferences, Stretcher

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    a = torch.randn(max(matrix, 1), max(matrix, 1))
    stretcher = Stretcher(factor, SharedReferences.for_work("collectives-paced"))
    mine, summed = torch.ones(numel), torch.zeros(numel)

    def collective(j: int) -> None:
        # two gathers, then a reduction, owners rotating (worker/collective_cost.py)
        run_collective("gather" if j % 3 < 2 else "reduce", j % ranks, rank, mine, summed)

    def segments() -> None:
        for j in range(collectives):
            if matrix:
                (a @ a).sum()
            else:
                time.sleep(gap_s)
            with stretcher.aside():
                collective(j)

    paced: list[float] = []
    back_to_back: list[float] = []
    for r in range(WARMUP + repeats):
        dist.barrier()
        stretcher.reset()
        stretcher.run(segments, key="segments")
        dist.barrier()
        start = time.perf_counter()
        for j in range(collectives):
            collective(j)
        if r >= WARMUP:
            paced.append(stretcher.aside_s / collectives)
            back_to_back.append((time.perf_counter() - start) / collectives)
    mine_out = {
        "paced_ms": 1e3 * statistics.median(paced),
        "back_to_back_ms": 1e3 * statistics.median(back_to_back),
        "segment_cpu_ms": 1e3 * (stretcher.reference_cpu_s(("segments", "segment", 1)) or 0.0),
    }
    gathered: list[Any] = [None] * ranks
    dist.all_gather_object(gathered, mine_out)
    if rank == 0:
        results.put(gathered)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--factor", type=float, default=4.0, help="emulation's stretch")
    parser.add_argument("--collectives", type=int, default=24)
    parser.add_argument("--numel", type=int, default=1 << 18, help="fp32 numbers a collective")
    parser.add_argument("--matrix", type=int, default=384, help="0: a sleep instead of compute")
    parser.add_argument("--gap-ms", type=float, default=6.0, help="the sleep with --matrix 0")
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[SHARED_REFERENCES_ENV] = tmp  # the spawned ranks inherit it
        per_rank = run_local_ranks(
            _ranks,
            args.ranks,
            (
                args.factor,
                args.collectives,
                args.numel,
                args.matrix,
                args.gap_ms / 1e3,
                args.repeats,
            ),
            600.0,
            "paced collectives",
        )
    between = f"{args.matrix}-square matmul x{args.factor:g}" if args.matrix else (
        f"{args.gap_ms:g} ms sleep"
    )  # fmt: skip
    print(
        f"{args.ranks} gloo ranks, {args.numel * 4 / 2**20:g} MiB a collective, "
        f"{between} between collectives"
    )
    for rank, r in enumerate(per_rank):
        print(
            f"  rank {rank}: after compute {r['paced_ms']:.3f} ms, back to back "
            f"{r['back_to_back_ms']:.3f} ms ({r['paced_ms'] / r['back_to_back_ms']:.2f}x); "
            f"segment least CPU {r['segment_cpu_ms']:.3f} ms"
        )


if __name__ == "__main__":
    main()

"""A rendezvous store served ahead by rank 0 lets the ranks that come first join at once.

Three spawned gloo ranks form a world group three times in a row, as re-formations do, through
the project's ``init_world`` (``init_process_group`` with ``tcp://``). Before each round rank 0
serves the store (``store_ahead.serve``) and publishes its port; the other ranks join at once,
rank 0 only ``LATE_S`` later, as a rank 0 that is still tearing down its old groups does. Every
rank must be in the group within ``MAX_LAG_S`` of rank 0 joining: without the store served ahead
the early ranks find no server, and torch's connect back-off keeps them out 0.4-0.7 s after rank
0 is up (measured on this host). Then one round where rank 0 comes first, and an all-reduce in
each round checks the groups work.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from orchestrator.worker import store_ahead
from orchestrator.worker.groups import init_world

WORLD = 3
LATE_S = 0.15  # rank 0 joins this long after the others
MAX_LAG_S = 0.15  # every rank joined within this of rank 0's join starting
ROUNDS = 4  # the last one with rank 0 first


def _port(out: Path, round_: int) -> int:
    path = out / f"port-{round_}"
    deadline = time.monotonic() + 30.0
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no port for round {round_}")
        time.sleep(0.005)
    return int(path.read_text())


def _rank_main(rank: int, out: Path) -> None:
    torch.set_num_threads(1)
    marks = []
    for round_ in range(ROUNDS):
        rank0_first = round_ == ROUNDS - 1
        held = None
        if rank == 0:
            held = store_ahead.serve("127.0.0.1")
            assert held is not None
            (out / f"port-{round_}.tmp").write_text(str(held.port))
            (out / f"port-{round_}.tmp").rename(out / f"port-{round_}")
            port = held.port
            if not rank0_first:
                time.sleep(LATE_S)
        else:
            port = _port(out, round_)
            if rank0_first:
                time.sleep(LATE_S)
        started = time.time()
        init_world("gloo", "127.0.0.1", port, rank, WORLD, 30.0)
        joined = time.time()
        held = None  # the world group holds the server now
        flag = torch.tensor([float(rank)])
        dist.all_reduce(flag)
        dist.destroy_process_group()
        marks.append({"started": started, "joined": joined, "sum": float(flag.item())})
    (out / f"rank-{rank}.json").write_text(json.dumps(marks))


@pytest.mark.slow
def test_ranks_join_as_soon_as_rank_0_does_when_its_store_is_served_ahead(tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(tmp_path,), nprocs=WORLD, join=True)
    marks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    for round_ in range(ROUNDS):
        got = [m[round_] for m in marks]
        assert all(g["sum"] == sum(range(WORLD)) for g in got), got
        last_start = max(g["started"] for g in got)  # the late rank's join
        lag = max(g["joined"] for g in got) - last_start
        assert lag < MAX_LAG_S, (round_, lag, got)

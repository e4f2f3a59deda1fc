"""Bucketed gradient all-reduce started from the backward's hooks (two gloo processes).

Each rank runs two microbatches' backward through three layers; with buckets of one layer the
reduction of the last layers starts before the backward reaches the first one, and the summed
gradients equal the blocking all-reduce's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from orchestrator.worker.grad_sync import OverlappedGradSync
from orchestrator.worker.local import free_port
from orchestrator.worker.topology import GradGroup

WIDTH = 16


def _layers() -> dict[int, nn.Module]:
    torch.manual_seed(0)
    return {i: nn.Linear(WIDTH, WIDTH) for i in range(3)}


def _backward(layers: dict[int, nn.Module], rank: int) -> None:
    for mb in range(2):
        torch.manual_seed(100 * rank + mb)
        out = torch.randn(4, WIDTH)
        for i in range(3):
            out = layers[i](out)
        out.square().mean().backward()


def _rank_main(rank: int, port: int, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        handle = dist.new_group([0, 1])
        layers = _layers()
        layer_bytes = WIDTH * (WIDTH + 1) * 4
        sync = OverlappedGradSync([(GradGroup((0, 1), (0, 1, 2)), handle)], layers, layer_bytes)
        sync.begin(num_microbatches=2)
        _backward(layers, rank)
        early = sync.launched_during_backward
        sync.finish()
        torch.save(
            {
                "early": early,
                "buckets": sync.num_buckets,
                "grads": {i: [p.grad.clone() for p in layers[i].parameters()] for i in layers},
            },
            out / f"rank-{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_buckets_start_during_backward_and_sum_like_all_reduce(tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(free_port(), tmp_path), nprocs=2, join=True)
    saved = [torch.load(tmp_path / f"rank-{r}.pt") for r in range(2)]
    # One bucket per layer; every bucket is complete before finish() (all parameters were used),
    # so all three started from the hooks, during the backward.
    assert saved[0]["buckets"] == 3
    assert saved[0]["early"] == 3 and saved[1]["early"] == 3
    # The sum of both ranks' locally accumulated gradients.
    expected: dict[int, list[torch.Tensor]] = {}
    for rank in range(2):
        layers = _layers()
        _backward(layers, rank)
        for i, layer in layers.items():
            grads = [p.grad for p in layer.parameters()]
            expected[i] = (
                [a + b for a, b in zip(expected[i], grads, strict=True)] if i in expected else grads
            )
    for rank in range(2):
        for i, grads in saved[rank]["grads"].items():
            for got, want in zip(grads, expected[i], strict=True):
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)

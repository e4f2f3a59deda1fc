"""Process groups built from the plan, and the gradient all-reduce.

The world group carries the point-to-point traffic between consecutive stages of a replica
(``isend``/``irecv`` address ranks directly, so no extra group is needed). For gradients, one
group per distinct set of ranks that hold the same layers (see ``topology.grad_groups``): each
layer's gradients are summed among exactly the ranks holding it. Backend: NCCL when CUDA is
present, gloo otherwise.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.spec.plan import Plan
from orchestrator.worker import subgroups
from orchestrator.worker.tensor_parallel import grad_contribution, set_grad_from_whole
from orchestrator.worker.topology import GradGroup, RankSpec, grad_groups, ranks_for_plan


def backend_for_device(device: torch.device) -> str:
    """``nccl`` for CUDA devices, ``gloo`` for the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_world(
    backend: str, master_addr: str, master_port: int, rank: int, world_size: int, timeout_s: float
) -> None:
    """Join the rendezvous at ``master_addr:master_port`` (TCP store on rank 0)."""
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


class GradientGroups:
    """The all-reduce groups this rank belongs to, created collectively over the whole world."""

    def __init__(self, plan: Plan, rank: int) -> None:
        self.rank = rank
        self.spec: RankSpec = ranks_for_plan(plan)[rank]
        self.mine: list[tuple[GradGroup, dist.ProcessGroup]] = []
        # new_group is collective over the world: every rank creates every group, same order.
        for group in grad_groups(plan):
            handle = subgroups.new_group(group.ranks)
            if rank in group.ranks:
                self.mine.append((group, handle))

    @property
    def handles(self) -> dict[tuple[int, ...], dist.ProcessGroup]:
        """Holder set -> its process group, for the groups this rank belongs to."""
        return {group.ranks: handle for group, handle in self.mine}

    def all_reduce(
        self, layers: dict[int, nn.Module], skip: Collection[tuple[int, ...]] = ()
    ) -> None:
        """Sum each shared layer's gradients among its holders, one flat buffer per group.

        Buffers are in the whole (tp-1) shape, so holders at different tp degrees line up; a
        parameter a stage never used still takes part (zeros), so every holder sends
        equal-sized buffers. Groups in ``skip`` (holder sets) are reduced elsewhere (sharding).
        """
        for group, handle in self.mine:
            if group.ranks in skip:
                continue
            grads = [
                grad_contribution(p, self.spec)
                for i in group.layers
                for p in layers[i].parameters()
            ]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=handle)
            offset = 0
            for i in group.layers:
                for p in layers[i].parameters():
                    n = p.numel()  # the whole tensor's count, for DTensors too
                    set_grad_from_whole(p, flat[offset : offset + n], self.spec)
                    offset += n

"""Gradient all-reduce overlapped with the backward pass, bucketed as DDP does.

Each gradient group's layers (``topology.grad_groups``) are cut into buckets of about
``bucket_bytes``, in backward order (last layer first). A parameter is *ready* once its gradient
has been accumulated for every microbatch of the step (``register_post_accumulate_grad_hook``
counts the accumulations); a bucket whose parameters are all ready is flattened and all-reduced
asynchronously while the backward of earlier layers goes on. The step waits for the reductions
only in :meth:`OverlappedGradSync.finish`, before the update.

Every holder of a group builds the same buckets from the same layers, and launches them strictly
in bucket order (a ready bucket waits for the ones before it), so the collectives of a group are
issued in one order on all its ranks. Parameters that never received a gradient in a step (a
layer the stage did not use) are reduced as zeros at ``finish``, as the blocking path does.

``torch.nn.parallel.DistributedDataParallel`` is not used: its buckets span one process group,
while here each layer is summed among the ranks that hold it (replicas cut the model at
different layers), with gradients accumulated over a pipeline's microbatches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.worker.topology import GradGroup

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # DDP's bucket_cap_mb


@dataclass
class _Bucket:
    params: list[nn.Parameter]
    handle: dist.ProcessGroup
    ready: int = 0
    flat: torch.Tensor | None = None
    work: dist.Work | None = None


@dataclass
class _GroupQueue:
    buckets: list[_Bucket]
    next_launch: int = 0


@dataclass
class OverlappedGradSync:
    """Starts each bucket's all-reduce from the backward's gradient hooks."""

    mine: list[tuple[GradGroup, dist.ProcessGroup]]
    layers: dict[int, nn.Module]
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    _queues: list[_GroupQueue] = field(default_factory=list)
    _bucket_of: dict[int, _Bucket] = field(default_factory=dict)
    _pending: dict[int, int] = field(default_factory=dict)
    _active: bool = False
    _hooks: list[Any] = field(default_factory=list)  # removable handles of the gradient hooks
    launched_during_backward: int = 0  # buckets started before finish() in the last step

    def __post_init__(self) -> None:
        for group, handle in self.mine:
            # Backward order: last layer first, and within a layer its last parameters first.
            params = [
                p
                for i in reversed(group.layers)
                for p in reversed(list(self.layers[i].parameters()))
            ]
            buckets: list[_Bucket] = []
            size = 0
            for p in params:
                nbytes = p.numel() * p.element_size()
                if not buckets or size + nbytes > self.bucket_bytes:
                    buckets.append(_Bucket(params=[], handle=handle))
                    size = 0
                buckets[-1].params.append(p)
                size += nbytes
            queue = _GroupQueue(buckets)
            self._queues.append(queue)
            for b in buckets:
                for p in b.params:
                    self._bucket_of[id(p)] = b
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    def close(self) -> None:
        """Remove the hooks: the layers may outlive this object (an actor re-formed for a new
        plan keeps its layers), and a hook left armed by an interrupted step would otherwise
        reduce the next engine's gradients over a stale group."""
        self._active = False
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    @property
    def num_buckets(self) -> int:
        return sum(len(q.buckets) for q in self._queues)

    def begin(self, num_microbatches: int) -> None:
        """Arm the hooks for a step whose backward runs ``num_microbatches`` times."""
        self._pending = {pid: num_microbatches for pid in self._bucket_of}
        for queue in self._queues:
            queue.next_launch = 0
            for b in queue.buckets:
                b.ready, b.flat, b.work = 0, None, None
        self.launched_during_backward = 0
        self._active = True

    def _on_grad(self, param: torch.Tensor) -> None:
        if not self._active:
            return
        pid = id(param)
        self._pending[pid] -= 1
        if self._pending[pid] == 0:
            self._bucket_of[pid].ready += 1
            self._launch_ready()

    def _launch_ready(self) -> None:
        for queue in self._queues:
            while queue.next_launch < len(queue.buckets):
                b = queue.buckets[queue.next_launch]
                if b.ready < len(b.params):
                    break
                self._launch(b)
                self.launched_during_backward += 1
                queue.next_launch += 1

    @staticmethod
    def _launch(b: _Bucket) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in b.params]
        b.flat = torch.cat([g.reshape(-1) for g in grads])
        b.work = dist.all_reduce(b.flat, op=dist.ReduceOp.SUM, group=b.handle, async_op=True)

    def finish(self) -> None:
        """Launch what is left (in order), wait for every bucket, write the summed gradients."""
        self._active = False
        for queue in self._queues:
            for b in queue.buckets[queue.next_launch :]:
                self._launch(b)
            queue.next_launch = len(queue.buckets)
        for queue in self._queues:
            for b in queue.buckets:
                assert b.work is not None and b.flat is not None
                b.work.wait()
                offset = 0
                for p in b.params:
                    n = p.numel()
                    p.grad = b.flat[offset : offset + n].view_as(p)
                    offset += n

"""Sharded data parallel layer by layer (ZeRO-3 / ZeRO-2 with FSDP's per-layer peak).

Used where every holder of the model is a one-stage replica and all of them shard
``gradients`` or ``full`` (``costmodel.sharding.runs_layer_by_layer``): each holder runs all its
layers forward then backward for each of its microbatches, with no pipeline, so the holders
can issue the same per-layer collectives in the same order. The shard group's flat slices
(``worker/sharding.py``: contiguous ranges of the group's flat parameters, one per holder) stay
as they are, so checkpoints, whole states and re-plans see the same layout as the once-a-step
path. Per microbatch (a *round*):

- ``full``: a forward pre-hook gathers a layer's parameters just before its forward (one
  ``broadcast`` per owner whose slice meets the layer), a forward hook frees them after it; a
  hook on the layer's output gathers them again just before the layer's backward.
- Both levels: that same hook points the layer's gradients at one zeroed flat buffer (autograd
  then accumulates into it in place, as DDP's ``gradient_as_bucket_view``); once every parameter
  of the layer has accumulated (``register_post_accumulate_grad_hook``), the buffer is reduced
  onto its owners (one ``reduce`` per owner whose slice meets the layer), each owner adds its
  part to its gradient slice, and the buffer (and under ``full`` the parameters) is freed. So a
  rank holds its slices plus about one layer's whole weights and one layer's whole gradients.

Holders with fewer microbatches (uneven batch shares) then run *empty rounds* up to the group's
largest microbatch count: the same gathers and reductions in the same order (recorded from the
rank's own first round), contributing zero gradients and computing nothing, so every collective
of every holder is matched; an owner still serves its slice to the gathers and still receives
the others' reductions into its slice.

Why not FSDP2's ``fully_shard``: it issues its gathers from module hooks of real forward and
backward calls, so a holder with fewer microbatches would have to run the model on empty
batches to match them; it cuts every parameter on dim 0, not the group's flat slices that the
state format, checkpoints and re-plans of this runtime use (and the once-a-step path keeps);
and it reduce-scatters over a mesh with equal shards. The piece here is the smallest that keeps
the slices: a pair of hooks per layer, ``broadcast`` and ``reduce`` per slice segment.

Evaluation is not a round: it gathers the whole parameters once (``ShardedState.ensure_whole``)
with the hooks idle, and the next step's :meth:`LayerwiseZero.begin` frees them again.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.costmodel.sharding import runs_layer_by_layer
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import MemoryUse
from orchestrator.worker.memory_account import ActivationAccount
from orchestrator.worker.sharding import ShardedState, _Group
from orchestrator.worker.tied import tied_groups

GATHER, REDUCE = "gather", "reduce"


@dataclass
class _Layer:
    """One planner layer inside its shard group's flat vector."""

    index: int
    params: list[nn.Parameter]
    shapes: list[torch.Size]
    start: int  # [start, end) in the group's flat parameters
    end: int
    # (owner position in the group, lo, hi): the owners' slices that meet [start, end)
    segments: list[tuple[int, int, int]] = field(default_factory=list)
    # per round: "released" | "forward" | "backward" | "done"
    phase: str = "released"
    grads: torch.Tensor | None = None  # the flat gradient buffer of the current round
    accumulated: int = 0

    @property
    def numel(self) -> int:
        return self.end - self.start


def applies(plan: Plan, model: Any) -> bool:
    """Whether this rank's engine runs ``plan``'s sharding layer by layer (tied weights, whose
    copies' gradients are summed whole after the backward, keep the once-a-step path)."""
    return runs_layer_by_layer(plan) and not tied_groups(model)


class LayerwiseZero:
    """The per-layer gathers and reductions of this rank's one shard group."""

    def __init__(
        self,
        plan: Plan,
        state: ShardedState,
        layers: dict[int, nn.Module],
        account: Callable[[], ActivationAccount | None] = lambda: None,
        aside: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        """``aside``: the context the hooks' collectives and buffers run in, inside the
        stretched forward and backward calls (``Stretcher.aside``: timed by the wall clock,
        not stretched as the device's compute)."""
        assert len(state.groups) == 1, "one shard group holds every layer of a one-stage replica"
        self.state = state
        self.g: _Group = state.groups[0]
        self.full = self.g.shards_parameters
        self.account = account
        self.aside = aside
        self.max_rounds = max(
            math.ceil(rep.batch_size / plan.microbatch_size) for rep in plan.replicas
        )
        self.layers: list[_Layer] = []
        offset = 0
        for i in self.g.group.layers:
            params = list(layers[i].parameters())
            shapes = [torch.Size(state.shapes.get(id(p), p.shape)) for p in params]
            n = sum(s.numel() for s in shapes)
            layer = _Layer(i, params, shapes, offset, offset + n)
            for k, (lo, hi) in enumerate(self.g.bounds):
                a, b = max(lo, layer.start), min(hi, layer.end)
                if a < b:
                    layer.segments.append((k, a, b))
            self.layers.append(layer)
            offset += n
        self._by_param = {id(p): layer for layer in self.layers for p in layer.params}
        self._hooks: list[Any] = []
        for layer in self.layers:
            module = layers[layer.index]
            self._hooks.append(module.register_forward_pre_hook(self._pre_forward(layer)))
            self._hooks.append(module.register_forward_hook(self._post_forward(layer)))
            for p in layer.params:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
        self.active = False
        self._round = -1
        self._rounds = 0
        self._ops: list[tuple[str, int]] = []  # this round's collectives, in order
        self._first_ops: list[tuple[str, int]] | None = None
        self._master: torch.Tensor | None = None
        self._grad_slice: torch.Tensor | None = None
        # live bytes and their peaks over the step: gathered whole weights, whole gradients
        self._weights_live = self._grads_live = 0
        self.weights_peak_bytes = self.grads_peak_bytes = 0
        self.collectives = 0  # issued in the last step (gathers and reductions)

    def close(self) -> None:
        """Remove the hooks (the layers may outlive this object)."""
        self.active = False
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    # -- the step ---------------------------------------------------------------------------

    def begin(self, num_microbatches: int) -> None:
        """Arm the hooks for a step of ``num_microbatches`` rounds on this rank; parameters
        still whole (just built, loaded or evaluated) are freed, their slices being current."""
        g = self.g
        assert g.master is not None
        self._master = g.master.detach()
        self._grad_slice = torch.zeros_like(self._master)
        for layer in self.layers:
            layer.phase, layer.accumulated, layer.grads = "released", 0, None
        if self.full and not g.released:
            for layer in self.layers:
                self._release(layer)
            g.released = True
        self._rounds = num_microbatches
        self._round = -1
        self._ops = []
        self._first_ops = None
        self._weights_live = self._grads_live = 0
        self.weights_peak_bytes = self.grads_peak_bytes = 0
        self.collectives = 0
        self.active = True

    def finish(self) -> None:
        """After this rank's microbatches: close the last round, run the empty rounds up to the
        group's largest count, and hand the summed gradient slice to the sharded state."""
        assert self.active, "begin() before finish()"
        self._end_round()
        ops = self._first_ops
        assert ops is not None, "a holder runs at least one microbatch"
        for _ in range(self._rounds, self.max_rounds):
            for op, i in ops:
                layer = self._layer(i)
                if op == GATHER:
                    self._gather_into(layer, self._buffer(layer.numel, weights=True))
                    self._free_buffer(layer.numel, weights=True)
                else:
                    zeros = self._buffer(layer.numel, weights=False, zero=True)
                    self._reduce(layer, zeros)
                    self._free_buffer(layer.numel, weights=False)
        self.active = False
        self.g.grad_slice = self._grad_slice
        self._grad_slice = None
        self._master = None

    def memory(self, counted: MemoryUse) -> MemoryUse:
        """The step's memory terms with this path's peaks: under ``full`` the whole weights
        gathered at once (the slices count with the optimizer state, as fp32 masters); the
        gradient slice plus the whole layer gradients live at once."""
        weights = self.weights_peak_bytes if self.full else counted.weights_bytes
        grads = self.slice_grad_bytes + self.grads_peak_bytes
        return replace(counted, weights_bytes=weights, grads_bytes=grads)

    @property
    def slice_grad_bytes(self) -> int:
        """Bytes of this rank's gradient slice (held through the step)."""
        assert self.g.master is not None
        return self.g.master.numel() * self.g.master.element_size()

    # -- hooks ------------------------------------------------------------------------------

    def _pre_forward(self, layer: _Layer) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            if not self.active or not torch.is_grad_enabled():
                return
            if layer is self.layers[0] and layer.phase != "backward":
                self._start_round()
            if self.full and layer.phase == "released":
                self._gather(layer)
                layer.phase = "forward"

        return hook

    def _post_forward(self, layer: _Layer) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self.active or not torch.is_grad_enabled() or layer.phase == "backward":
                return  # idle, or a recomputation inside the backward
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(self._pre_backward(layer))
            if self.full:
                self._release(layer)
            layer.phase = "released"

        return hook

    def _pre_backward(self, layer: _Layer) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if not self.active or layer.phase != "released":
                return
            if self.full:
                self._gather(layer)
            self._point_grads(layer)
            layer.phase = "backward"

        return hook

    def _on_grad(self, param: torch.Tensor) -> None:
        if not self.active:
            return
        layer = self._by_param[id(param)]
        if layer.phase != "backward":
            return
        layer.accumulated += 1
        if layer.accumulated == len(layer.params):
            self._finish_layer(layer)

    # -- rounds -----------------------------------------------------------------------------

    def _start_round(self) -> None:
        if self._round >= 0:
            self._end_round()
        self._round += 1
        self._ops = []
        for layer in self.layers:
            layer.phase, layer.accumulated = "released", 0

    def _end_round(self) -> None:
        """Reduce what the backward left (layers that received no gradient, in backward
        order, as every holder's identical graph leaves them) and record the round's order."""
        if self._round < 0:
            return
        for layer in reversed(self.layers):
            if layer.phase == "done":
                continue
            if layer.grads is None:
                self._point_grads(layer)
            self._finish_layer(layer)
        if self._first_ops is None:
            self._first_ops = list(self._ops)
        elif self._ops != self._first_ops:
            raise RuntimeError("a round's collectives differ from the first round's")

    def _finish_layer(self, layer: _Layer) -> None:
        with self.aside():
            self._finish_layer_aside(layer)

    def _finish_layer_aside(self, layer: _Layer) -> None:
        assert layer.grads is not None
        offset = 0
        for p, shape in zip(layer.params, layer.shapes, strict=True):
            n = shape.numel()
            view = layer.grads[offset : offset + n]
            if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad.reshape(-1))  # autograd replaced the view: take its tensor
            offset += n
        self._reduce(layer, layer.grads)
        for p in layer.params:
            p.grad = None
        layer.grads = None
        self._free_buffer(layer.numel, weights=False)
        if self.full and layer.phase == "backward":
            self._release(layer)
        layer.phase = "done"

    # -- collectives ------------------------------------------------------------------------

    def _gather(self, layer: _Layer) -> None:
        """Whole parameters of ``layer`` from its owners' slices."""
        with self.aside():
            self._gather_aside(layer)

    def _gather_aside(self, layer: _Layer) -> None:
        flat = self._buffer(layer.numel, weights=True)
        self._gather_into(layer, flat)
        offset = 0
        for p, shape in zip(layer.params, layer.shapes, strict=True):
            n = shape.numel()
            p.data = flat[offset : offset + n].view(shape)
            offset += n
        account = self.account()
        if account is not None:  # gathered storage is a parameter, not an activation
            account.add_parameters(layer.params)

    def _gather_into(self, layer: _Layer, flat: torch.Tensor) -> None:
        g = self.g
        assert self._master is not None
        lo_mine = g.bounds[g.index][0]
        for k, a, b in layer.segments:
            piece = flat[a - layer.start : b - layer.start]
            if k == g.index:
                piece.copy_(self._master[a - lo_mine : b - lo_mine])
            dist.broadcast(piece, src=g.group.sharded[k], group=g.sharded_handle)
            self.collectives += 1
        self._ops.append((GATHER, layer.index))

    def _reduce(self, layer: _Layer, flat: torch.Tensor) -> None:
        """Sum ``flat`` (a layer's gradient) over the holders onto each segment's owner."""
        g = self.g
        assert self._grad_slice is not None
        lo_mine = g.bounds[g.index][0]
        for k, a, b in layer.segments:
            piece = flat[a - layer.start : b - layer.start]
            dist.reduce(piece, dst=g.group.sharded[k], op=dist.ReduceOp.SUM, group=g.all_handle)
            self.collectives += 1
            if k == g.index:
                self._grad_slice[a - lo_mine : b - lo_mine] += piece
        self._ops.append((REDUCE, layer.index))

    def _point_grads(self, layer: _Layer) -> None:
        """The layer's gradients become views of one zeroed flat buffer: autograd accumulates
        into them in place, and the buffer is what is reduced."""
        with self.aside():
            flat = self._buffer(layer.numel, weights=False, zero=True)
        offset = 0
        for p, shape in zip(layer.params, layer.shapes, strict=True):
            n = shape.numel()
            p.grad = flat[offset : offset + n].view(shape)
            offset += n
        layer.grads = flat
        layer.accumulated = 0

    def _release(self, layer: _Layer) -> None:
        account = self.account()
        if account is not None:
            account.drop_parameters(layer.params)
        for p in layer.params:
            if p.numel():
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if layer.phase in ("forward", "backward"):
            self._free_buffer(layer.numel, weights=True)

    def _layer(self, index: int) -> _Layer:
        return next(layer for layer in self.layers if layer.index == index)

    # -- accounting -------------------------------------------------------------------------

    def _buffer(self, numel: int, weights: bool, zero: bool = False) -> torch.Tensor:
        assert self._master is not None
        make = torch.zeros if zero else torch.empty
        out = make(numel, dtype=self._master.dtype, device=self._master.device)
        nbytes = numel * out.element_size()
        if weights:
            self._weights_live += nbytes
            self.weights_peak_bytes = max(self.weights_peak_bytes, self._weights_live)
        else:
            self._grads_live += nbytes
            self.grads_peak_bytes = max(self.grads_peak_bytes, self._grads_live)
        return out

    def _free_buffer(self, numel: int, weights: bool) -> None:
        assert self._master is not None
        nbytes = numel * self._master.element_size()
        if weights:
            self._weights_live -= nbytes
        else:
            self._grads_live -= nbytes

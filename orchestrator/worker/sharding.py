"""Sharded data parallel: holders of the same layers split optimizer state (and gradients).

For each shard group (``topology.shard_groups``: the holders of some layers, two or more of which
shard them) the group's parameters are seen as one flat vector, cut into contiguous slices, one
per sharded holder. Each sharded holder keeps the optimizer state of its slice only and updates
that slice; the updated slices are then broadcast to the other sharded holders, so every holder
again has whole parameters for the next step (ZeRO-1, Rajbhandari et al. 2020). With
``gradients`` (ZeRO-2) and a group whose holders all shard, the gradient is reduced slice by
slice onto its owner instead of all-reduced, and a rank keeps only its slice of the summed
gradient. Where some holders of the layers do not shard, the group all-reduces whole gradients
(those holders need them) and the sharded ones drop what they do not own.

Why our own piece and not FSDP2's ``fully_shard``: our plans sum a layer's gradient over
replicas that shard and replicas that do not, with batch shares that differ per replica, and
over groups that mix device types; ``fully_shard`` ties the gradient reduction group to the
shard group and splits every parameter evenly on dim 0 of its mesh, so it cannot express a
group where only some holders shard, nor slices whose sizes are chosen apart from the batch
shares. Slices here are contiguous ranges of the flat vector (``topology.shard_bounds``); the
reduce and the gather are one ``reduce`` / ``broadcast`` per slice, which gloo and NCCL both
run and which take slices of any size.

``full`` (ZeRO-3) also shards the parameters at rest: after the backward a sharded holder frees
the layers' whole parameters and keeps only its slice (the fp32 master it updates); the next use
(the next step's first forward, or an evaluation) gathers the slices into whole parameters again,
one ``broadcast`` per slice, and they stay whole for every microbatch of that step. FSDP2 gathers
each layer before each microbatch's forward and backward instead; that is a collective per
microbatch, and the holders of a group run different numbers of microbatches (uneven batch
shares) in different pipeline schedules, so per-microbatch gathers could not be matched across
them. One gather per step is FSDP2's ``reshard_after_forward=False`` with
``set_reshard_after_backward(False)``: whole weights during the step, slices between steps.
Where every holder is a one-stage replica sharding ``gradients`` or ``full``, the step runs
layer by layer instead (``worker/layerwise.py``: per-layer gathers and reductions every
microbatch, over these same slices), and :meth:`ShardedState.after_backward` is not used.

States move in two forms, like tensor parallel's: ``layer_states`` gives this rank's params
(whole) and its slice of the optimizer state under a ``"zero_shard"`` record;
:func:`merge_sharded_states` joins the sharded holders' parts into the whole per-layer state that
checkpoints store, and :meth:`ShardedState.load` cuts a whole state for this rank.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.errors import SpecError
from orchestrator.spec.plan import Plan, Sharding
from orchestrator.worker import subgroups, tensor_parallel
from orchestrator.worker.optim import optimizer_order, recipe_optimizer, set_learning_rate
from orchestrator.worker.recipe import OptimizerRecipe
from orchestrator.worker.topology import ShardGroup, shard_bounds, shard_groups

ZERO_KEY = "zero_shard"


class _Group:
    """One shard group as this rank sees it."""

    def __init__(self, group: ShardGroup, rank: int, all_handle: Any, sharded_handle: Any) -> None:
        self.group = group
        self.all_handle = all_handle  # every holder of the layers
        self.sharded_handle = sharded_handle  # the sharded holders
        self.index = group.sharded.index(rank)
        self.bounds: list[tuple[int, int]] = []
        # This rank's slice of the flat parameters, as the optimizer's leaves: one tensor, or
        # with weight decay one per decay group (``masks``: where each sits in the slice).
        self.pieces: list[torch.Tensor] = []
        self.masks: list[torch.Tensor] | None = None
        self.counted: torch.Tensor | None = None  # clipping: slice elements not tied copies
        self.optimizer: torch.optim.Optimizer | None = None
        self.grad_slice: torch.Tensor | None = None
        # ``full``: whether the layers' parameters are freed (only ``master`` holds them)
        self.released = False

    @property
    def master(self) -> torch.Tensor | None:
        """This rank's slice of the flat parameters (fp32), joined from the pieces."""
        if not self.pieces:
            return None
        return self.join([p.detach() for p in self.pieces])

    def join(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-piece tensors -> one tensor over the slice."""
        if self.masks is None:
            return tensors[0]
        lo, hi = self.mine
        out = torch.empty(hi - lo, dtype=tensors[0].dtype, device=tensors[0].device)
        for mask, t in zip(self.masks, tensors, strict=True):
            out[mask] = t
        return out

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A tensor over the slice -> one per piece."""
        if self.masks is None:
            return [flat]
        return [flat[mask] for mask in self.masks]

    @property
    def shards_parameters(self) -> bool:
        return self.group.level.shards_parameters

    @property
    def reduces_itself(self) -> bool:
        """True when gradients go slice by slice to their owners (no whole all-reduce)."""
        return self.group.level.shards_gradients and self.group.all_sharded

    @property
    def mine(self) -> tuple[int, int]:
        return self.bounds[self.index]


def _params(layers: dict[int, nn.Module], group: ShardGroup) -> list[nn.Parameter]:
    return [p for i in group.layers for p in layers[i].parameters()]


def _flat_params(layers: dict[int, nn.Module], group: ShardGroup) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in _params(layers, group)])


class ShardedState:
    """The shard groups this rank belongs to, their slices, optimizers and collectives."""

    def __init__(
        self,
        plan: Plan,
        rank: int,
        layers: dict[int, nn.Module],
        optimizers: dict[int, torch.optim.Optimizer],
        recipe: OptimizerRecipe,
        all_handles: dict[tuple[int, ...], Any],
        tied: Collection[tuple[int, str]] = (),
    ) -> None:
        """Create the sharded holders' process groups (collective over the world: every rank
        builds this object, in the same order) and take over the per-layer optimizers of this
        rank's sharded layers (their state, if any, is cut to this rank's slice). ``tied``:
        the (layer, parameter) copies of tied weights, left out of the clipping norm."""
        self.rank = rank
        self.recipe = recipe
        self.tied = set(tied)
        self.groups: list[_Group] = []
        # Per sharded layer: its parameter names, the optimizer's state order and param groups
        # (the recipe groups parameters by shape), so whole states keep the recipe's layout.
        self.names: dict[int, list[str]] = {}
        self.orders: dict[int, list[str]] = {}
        self.param_groups: dict[int, list[dict[str, Any]]] = {}
        self.shapes: dict[int, tuple[int, ...]] = {}  # id(parameter) -> whole shape (``full``)
        for group in shard_groups(plan):
            handle = subgroups.new_group(group.sharded)
            if rank in group.sharded:
                self.groups.append(_Group(group, rank, all_handles[group.ranks], handle))
        for g in self.groups:
            whole = {}
            for i in g.group.layers:
                opt = optimizers.pop(i)
                self.names[i] = [name for name, _ in layers[i].named_parameters()]
                self.orders[i] = optimizer_order(layers[i], opt)
                whole[i] = {"optimizer": opt.state_dict()}
                self.param_groups[i] = whole[i]["optimizer"]["param_groups"]
            self._init_slice(g, layers, whole)
            if g.shards_parameters:
                for p in _params(layers, g.group):
                    self.shapes[id(p)] = tuple(p.shape)

    @property
    def slice_numels(self) -> tuple[int, ...]:
        """The length of this rank's slice in each of its shard groups: what its optimizer
        steps (the update's work, for emulation's reference times)."""
        return tuple(g.mine[1] - g.mine[0] for g in self.groups)

    @property
    def layers(self) -> set[int]:
        """Planner layers whose optimizer state this object holds (sliced)."""
        return {i for g in self.groups for i in g.group.layers}

    @property
    def self_reduced(self) -> set[tuple[int, ...]]:
        """Gradient groups that must not be all-reduced whole (their slices are reduced here)."""
        return {g.group.ranks for g in self.groups if g.reduces_itself}

    def _init_slice(
        self, g: _Group, layers: dict[int, nn.Module], whole: dict[int, dict[str, Any]]
    ) -> None:
        flat = _flat_params(layers, g.group)
        g.bounds = shard_bounds(flat.numel(), len(g.group.sharded))
        lo, hi = g.mine
        g.masks, decays, g.counted = self._slice_layout(g, layers)
        g.pieces = [t.clone().requires_grad_(True) for t in g.split(flat[lo:hi])]
        g.optimizer = recipe_optimizer(
            self.recipe,
            [{"params": [t], "weight_decay": d} for t, d in zip(g.pieces, decays, strict=True)],
        )
        sliced = _slice_optimizer_state(
            [whole[i]["optimizer"] for i in g.group.layers],
            [self.names[i] for i in g.group.layers],
            [self.orders[i] for i in g.group.layers],
            lo,
            hi,
        )
        if sliced is not None:
            state = g.optimizer.state_dict()
            state["state"] = {
                k: {
                    key: g.split(v)[k].clone() if isinstance(v, torch.Tensor) and v.dim() > 0 else v
                    for key, v in sliced.items()
                }
                for k in range(len(g.pieces))
            }
            g.optimizer.load_state_dict(state)

    def _slice_layout(
        self, g: _Group, layers: dict[int, nn.Module]
    ) -> tuple[list[torch.Tensor] | None, list[float], torch.Tensor | None]:
        """(piece masks, each piece's weight decay, the elements clipping counts) of this
        rank's slice. The recipe decays tensors of 2+ dimensions only, so with weight decay the
        slice is split where it crosses parameters of both kinds; tied copies (counted once,
        by their first member) are left out of the clipping norm."""
        lo, hi = g.mine
        decay = torch.zeros(hi - lo, dtype=torch.bool)
        counted = torch.ones(hi - lo, dtype=torch.bool)
        offset = 0
        for i in g.group.layers:
            for name, p in layers[i].named_parameters():
                n = int(torch.Size(self.shapes.get(id(p), p.shape)).numel())
                a, b = max(offset, lo) - lo, min(offset + n, hi) - lo
                if a < b:
                    decay[a:b] = len(self.shapes.get(id(p), p.shape)) >= 2
                    counted[a:b] = (i, name) not in self.tied
                offset += n
        wd = self.recipe.weight_decay
        device = _params(layers, g.group)[0].device
        counts = None if bool(counted.all()) else counted.to(device)
        if not wd or bool(decay.all()) or not bool(decay.any()):
            return None, [wd if bool(decay.any()) else 0.0], counts
        return [decay.to(device), (~decay).to(device)], [wd, 0.0], counts

    def after_backward(self, layers: dict[int, nn.Module]) -> None:
        """Bring each group's summed gradient slice to its owner; free the rest."""
        for g in self.groups:
            params = _params(layers, g.group)
            flat = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                    for p in params
                ]
            )
            if g.reduces_itself:
                # One reduce per slice (sizes may differ), in slice order on every holder.
                for k, (lo, hi) in enumerate(g.bounds):
                    piece = flat[lo:hi].contiguous()
                    dist.reduce(
                        piece, dst=g.group.sharded[k], op=dist.ReduceOp.SUM, group=g.all_handle
                    )
                    if k == g.index:
                        g.grad_slice = piece
            else:
                lo, hi = g.mine
                g.grad_slice = flat[lo:hi].clone()  # already summed by the whole all-reduce
            for p in params:
                p.grad = None  # only the slice is kept
            if g.shards_parameters:
                _release(params)
                g.released = True

    def squared_norm(self, writers: dict[int, int]) -> torch.Tensor:
        """Squared norm of this rank's gradient slices of groups whose writer (``writers``:
        layer -> rank) is a sharded holder (where it is not, the writer counts whole
        gradients); tied copies left out. After :meth:`after_backward`."""
        total = torch.zeros(())
        for g in self.groups:
            if g.grad_slice is None or writers[g.group.layers[0]] not in g.group.sharded:
                continue
            grad = g.grad_slice if g.counted is None else g.grad_slice[g.counted]
            total = total.to(grad.device) + grad.detach().float().pow(2).sum()
        return total

    def scale_gradients(self, coefficient: float) -> None:
        """Multiply the gradient slices by ``coefficient`` (global-norm clipping)."""
        if coefficient >= 1.0:
            return
        for g in self.groups:
            if g.grad_slice is not None:
                g.grad_slice.mul_(coefficient)

    def step(self, layers: dict[int, nn.Module], learning_rate: float | None = None) -> None:
        """Update this rank's slices (at ``learning_rate``, the schedule's value for the step),
        then gather every slice into the whole parameters."""
        self.update_slices(learning_rate)
        self.gather_updated(layers)

    def update_slices(self, learning_rate: float | None = None) -> None:
        """The optimizer step on this rank's slices (compute: an emulated device stretches
        it); :meth:`gather_updated` then brings the whole parameters back (communication)."""
        for g in self.groups:
            assert g.master is not None and g.optimizer is not None
            assert g.grad_slice is not None, "after_backward() before step()"
            if learning_rate is not None:
                set_learning_rate(g.optimizer, learning_rate)
            for piece, grad in zip(g.pieces, g.split(g.grad_slice), strict=True):
                piece.grad = grad
            g.optimizer.step()
            for piece in g.pieces:
                piece.grad = None
            g.grad_slice = None

    def gather_updated(self, layers: dict[int, nn.Module]) -> None:
        """Gather every holder's updated slice into the whole parameters (collective over each
        group's sharded holders, after :meth:`update_slices`); ``full`` groups are gathered at
        their next use instead (:meth:`ensure_whole`)."""
        for g in self.groups:
            if g.shards_parameters:
                continue
            flat = self._gather(g)
            offset = 0
            with torch.no_grad():
                for p in _params(layers, g.group):
                    n = p.numel()
                    p.copy_(flat[offset : offset + n].view_as(p))
                    offset += n

    @staticmethod
    def _gather(g: _Group) -> torch.Tensor:
        """Every sharded holder's slice of the group's flat parameters, joined (collective
        over the sharded holders, in slice order)."""
        assert g.master is not None
        pieces = []
        for k, (lo, hi) in enumerate(g.bounds):
            buf = (
                g.master.detach().clone()
                if k == g.index
                else torch.empty(hi - lo, dtype=g.master.dtype, device=g.master.device)
            )
            dist.broadcast(buf, src=g.group.sharded[k], group=g.sharded_handle)
            pieces.append(buf)
        return torch.cat(pieces)

    def ensure_whole(self, layers: dict[int, nn.Module]) -> bool:
        """``full``: gather released parameters into whole ones (collective over each group's
        sharded holders; every holder calls it at the same point: before a step's forward or an
        evaluation). Returns whether anything was gathered."""
        gathered = False
        for g in self.groups:
            if not g.released:
                continue
            flat = self._gather(g)
            offset = 0
            for p in _params(layers, g.group):
                n = int(torch.Size(self.shapes[id(p)]).numel())
                p.data = flat[offset : offset + n].view(self.shapes[id(p)])
                offset += n
            g.released = False
            gathered = True
        return gathered

    def released_weight_bytes(self) -> int:
        """Bytes of the whole parameters released now (what a step holds once gathered)."""
        total = 0
        for g in self.groups:
            if g.released and g.pieces:
                numel = g.bounds[-1][1]
                total += numel * g.pieces[0].element_size()
        return total

    def materialize(self, layers: dict[int, nn.Module]) -> None:
        """Give released parameters their whole shapes again (uninitialised) so that whole
        states can be loaded into them; :meth:`load` then re-cuts the slices."""
        for g in self.groups:
            if g.released:
                for p in _params(layers, g.group):
                    p.data = torch.empty(self.shapes[id(p)], dtype=p.dtype, device=p.device)
                g.released = False

    def layer_states(self, layers: dict[int, nn.Module]) -> dict[int, dict[str, Any]]:
        """This rank's part of its sharded layers' state: whole params, sliced optimizer."""
        out: dict[int, dict[str, Any]] = {}
        for g in self.groups:
            assert g.optimizer is not None
            opt = _joined_optimizer_state(g)
            lo, hi = g.mine
            record = {
                "layers": list(g.group.layers),
                "slice": [lo, hi],
                "index": g.index,
                "parts": len(g.group.sharded),
                "optimizer": opt,
                "names": {i: self.names[i] for i in g.group.layers},
                "orders": {i: self.orders[i] for i in g.group.layers},
                "param_groups": {i: self.param_groups[i] for i in g.group.layers},
            }
            if g.released:
                # Parameters live in the slices only: the slice travels, with the shapes and
                # the buffers, and :func:`merge_sharded_states` joins the holders' slices.
                assert g.master is not None
                record["param_slice"] = g.master.detach().to("cpu", copy=True)
                record["shapes"] = {
                    i: {n: list(self.shapes[id(p)]) for n, p in layers[i].named_parameters()}
                    for i in g.group.layers
                }
            for i in g.group.layers:
                params = tensor_parallel._local(layers[i].state_dict())
                if g.released:
                    names = set(self.names[i])
                    params = {k: v for k, v in params.items() if k not in names}  # buffers
                out[i] = {"params": params, ZERO_KEY: record}
        return out

    def load(self, layers: dict[int, nn.Module], states: dict[int, dict[str, Any]]) -> None:
        """Re-cut this rank's slices from whole per-layer states (params already loaded)."""
        for g in self.groups:
            self._init_slice(g, layers, {i: states[i] for i in g.group.layers})


def _slice_optimizer_state(
    states: Sequence[dict[str, Any]],
    names: Sequence[Sequence[str]],
    orders: Sequence[Sequence[str]],
    lo: int,
    hi: int,
) -> dict[str, Any] | None:
    """Per-layer optimizer state dicts -> the flat slice ``[lo, hi)`` of their per-parameter
    tensors, taken in parameter order (``names``; ``orders``: each layer's state index ->
    parameter name). Scalars such as Adam's step are alike across parameters; None if
    stateless."""
    entries: list[dict[str, Any]] = []
    for state, layer_names, order in zip(states, names, orders, strict=True):
        index = {name: k for k, name in enumerate(order)}
        for name in layer_names:
            entry = state.get("state", {}).get(index[name])
            if entry is None:
                return None
            entries.append(entry)
    out: dict[str, Any] = {}
    for key, value in entries[0].items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            flat = torch.cat([e[key].reshape(-1) for e in entries])
            out[key] = flat[lo:hi].clone()
        else:
            out[key] = value.clone() if isinstance(value, torch.Tensor) else value
    return out


def merge_sharded_states(parts_by_layer: dict[int, list[dict[str, Any]]]) -> dict[int, Any]:
    """Planner layer -> parts from its sources -> planner layer -> whole state.

    Sharded parts of a group's layers share one flat optimizer state; it is joined from every
    sharded holder's slice and cut back per layer and parameter.
    """
    out: dict[int, Any] = {}
    done: set[int] = set()
    for layer, parts in sorted(parts_by_layer.items()):
        if layer in done:
            continue
        if ZERO_KEY not in parts[0]:
            out[layer] = tensor_parallel.merge_layer_states(parts)
            continue
        records = sorted((p[ZERO_KEY] for p in parts), key=lambda r: int(r["index"]))
        if [r["index"] for r in records] != list(range(records[0]["parts"])):
            raise ValueError(f"need every sharded holder's slice to merge layer {layer}")
        group_layers = records[0]["layers"]
        slices = [r["optimizer"]["state"].get(0) for r in records]
        flat: dict[str, Any] = {}
        if all(s is not None for s in slices):
            for key, value in slices[0].items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    flat[key] = torch.cat([s[key] for s in slices])
                else:
                    flat[key] = value
        whole_params = _joined_params(records, parts_by_layer)
        offset = 0
        for i in group_layers:
            params = whole_params.get(i, parts_by_layer[i][0]["params"])
            state: dict[int, dict[str, Any]] = {}
            names = records[0]["names"][i]
            index = {name: k for k, name in enumerate(records[0]["orders"][i])}
            for name in names:
                n = params[name].numel()
                if flat:
                    state[index[name]] = {
                        key: (
                            v[offset : offset + n].view_as(params[name]).clone()
                            if isinstance(v, torch.Tensor) and v.dim() > 0
                            else (v.clone() if isinstance(v, torch.Tensor) else v)
                        )
                        for key, v in flat.items()
                    }
                offset += n
            groups = records[0]["param_groups"][i]
            out[i] = {"params": params, "optimizer": {"state": state, "param_groups": groups}}
            done.add(i)
    return out


def _joined_optimizer_state(g: _Group) -> dict[str, Any]:
    """The slice's optimizer state as one entry over the slice (the pieces' states joined)."""
    assert g.optimizer is not None
    state = tensor_parallel._local(g.optimizer.state_dict())
    entries = [state["state"].get(k) for k in range(len(g.pieces))]
    if any(e is None for e in entries):
        return {"state": {}, "param_groups": state["param_groups"]}
    joined = {
        key: g.join([e[key] for e in entries])
        if isinstance(value, torch.Tensor) and value.dim() > 0
        else value
        for key, value in entries[0].items()
    }
    return {"state": {0: joined}, "param_groups": state["param_groups"]}


def _joined_params(
    records: Sequence[dict[str, Any]], parts_by_layer: dict[int, list[dict[str, Any]]]
) -> dict[int, dict[str, torch.Tensor]]:
    """``full`` records: layer -> whole params (and buffers) joined from every holder's
    parameter slice; empty for groups whose holders keep whole parameters."""
    if "param_slice" not in records[0]:
        return {}
    flat = torch.cat([r["param_slice"] for r in records])
    out: dict[int, dict[str, torch.Tensor]] = {}
    offset = 0
    for i in records[0]["layers"]:
        params: dict[str, torch.Tensor] = {}
        for name in records[0]["names"][i]:
            shape = torch.Size(records[0]["shapes"][i][name])
            params[name] = flat[offset : offset + shape.numel()].view(shape).clone()
            offset += shape.numel()
        params.update(parts_by_layer[i][0]["params"])  # buffers
        out[i] = params
    return out


def _release(params: Sequence[nn.Parameter]) -> None:
    """Free whole parameters (``full``): each becomes an empty tensor until gathered."""
    for p in params:
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)


def check_recipe(plan: Plan, recipe: OptimizerRecipe, precision: str) -> None:
    """Raise :class:`SpecError` for what sharded stages do not execute yet: fp16 loss scaling
    (its overflow check and unscale read whole gradients, which a sharded holder no longer has
    after the reduce). Weight decay (per decay group of the slice) and global-norm clipping
    (each slice's norm counted once) run as in the unsharded update.
    """
    sharded = [
        f"plan.replicas[{r}].stages[{s}].sharding"
        for r, replica in enumerate(plan.replicas)
        for s, stage in enumerate(replica.stages)
        if stage.sharding is not Sharding.NONE
    ]
    if not sharded:
        return
    where = sharded[0]
    if precision == "fp16":
        raise SpecError(
            "sharded stages do not run fp16 loss scaling yet",
            field=where,
            fix="set sharding: none, or training.precision: bf16",
        )

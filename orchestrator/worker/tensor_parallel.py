"""Tensor-parallel stages: ``torch.distributed.tensor.parallel`` over the plan's tp groups.

A stage with ``tp == n`` runs on ``n`` ranks of one node (see ``topology``). Each rank builds the
stage's layers whole (seeded per layer, as at tp 1), then ``parallelize_module`` splits the
submodules the model names in ``tensor_parallel_plan`` over a one-dimensional ``DeviceMesh`` of
the stage's ranks (``ColwiseParallel`` / ``RowwiseParallel``; DTensor works over gloo on the CPU
and NCCL on GPUs). Activations enter and leave a stage replicated, so the pipeline and the loss
need not know about the split.

State moves by planner layer as elsewhere, in two forms:

- *local*: what one rank holds (its shard of split parameters and of their optimizer state,
  whole replicated ones) plus a ``"tp_shard"`` record of how it was cut. ``get_layer_states``
  returns this; it needs no collective, so it can be answered while a step is blocked.
- *whole*: the tp-1 form checkpoints store. :func:`merge_layer_states` joins the local states of
  a stage's ranks; :func:`local_part` cuts a whole state for a rank of any tp degree, so a layer
  saved at tp 2 restores at tp 1 and back.

Gradients of a layer shared with other replicas are exchanged in the whole form (see
:func:`grad_contribution`), so replicas holding one layer at different tp degrees sum correctly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from orchestrator.errors import SpecError
from orchestrator.spec.plan import Plan
from orchestrator.worker import subgroups
from orchestrator.worker.model_api import LayeredModel
from orchestrator.worker.optim import optimizer_order
from orchestrator.worker.topology import RankSpec, tp_groups

SHARD_KEY = "tp_shard"
STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def check_model(model: LayeredModel, plan: Plan) -> None:
    """Raise :class:`SpecError` if the plan has tp > 1 stages the model cannot split."""
    degrees = sorted({s.tp for r in plan.replicas for s in r.stages if s.tp > 1})
    if not degrees:
        return
    if not callable(getattr(model, "tensor_parallel_plan", None)):
        raise SpecError(
            f"the plan has tensor-parallel stages (tp {degrees}) but model {model.name!r} "
            "declares no tensor_parallel_plan",
            field="plan.replicas[].stages[].tp",
            fix="use tp: 1 or give the model a tensor_parallel_plan(index) method",
        )
    check = getattr(model, "check_tensor_parallel", None)
    if callable(check):
        for tp in degrees:
            check(tp)


def make_mesh(plan: Plan, spec: RankSpec, device: torch.device) -> DeviceMesh | None:
    """Create every tp group (collective over the world, same order on every rank); return
    this rank's mesh, or None at tp 1."""
    mine: DeviceMesh | None = None
    for ranks in tp_groups(plan):
        group = subgroups.new_group(ranks)
        if spec.rank in ranks:
            mine = DeviceMesh.from_group(group, device.type)
    return mine


def parallelize(
    layers: dict[int, nn.Module], model: LayeredModel, mesh: DeviceMesh
) -> dict[int, nn.Module]:
    """Split each layer's submodules as the model's ``tensor_parallel_plan`` says (in place)."""
    declare = model.tensor_parallel_plan  # type: ignore[attr-defined]
    for index, layer in layers.items():
        styles: dict[str, ParallelStyle] = {
            name: STYLES[kind]() for name, kind in declare(index).items()
        }
        if styles:
            parallelize_module(layer, mesh, styles)
    return layers


def shard_dims(layer: nn.Module) -> dict[str, int | None]:
    """Parameter name -> the dimension it is split along (None: replicated or plain)."""
    dims: dict[str, int | None] = {}
    for name, p in layer.named_parameters():
        dims[name] = None
        if isinstance(p, DTensor):
            placement = p.placements[0]
            if isinstance(placement, Shard):
                dims[name] = placement.dim
    return dims


def _local(t: Any) -> Any:
    if isinstance(t, DTensor):
        return t.to_local().detach().to("cpu", copy=True)
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", copy=True)
    if isinstance(t, dict):
        return {k: _local(v) for k, v in t.items()}
    if isinstance(t, list):
        return [_local(v) for v in t]
    return t


def local_layer_state(
    layer: nn.Module, optimizer: torch.optim.Optimizer, spec: RankSpec
) -> dict[str, Any]:
    """This rank's part of a layer's state, on the CPU, with how it was cut."""
    params = {name: _local(p) for name, p in layer.named_parameters()}
    params.update({name: _local(b) for name, b in layer.named_buffers()})
    return {
        "params": params,
        "optimizer": _local(optimizer.state_dict()),
        SHARD_KEY: {
            "tp": spec.tp,
            "tp_rank": spec.tp_rank,
            "dims": shard_dims(layer),
            # Optimizer state index -> parameter name (the recipe groups parameters by shape).
            "order": optimizer_order(layer, optimizer),
        },
    }


def merge_layer_states(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Join the local states of one stage's ranks (any order) into the whole tp-1 state."""
    if len(parts) == 1 and SHARD_KEY not in parts[0]:
        return parts[0]
    parts = sorted(parts, key=lambda p: int(p[SHARD_KEY]["tp_rank"]))
    info = parts[0][SHARD_KEY]
    if [p[SHARD_KEY]["tp_rank"] for p in parts] != list(range(info["tp"])):
        raise ValueError(f"need tp positions 0..{info['tp'] - 1} to merge a layer's state")
    dims: dict[str, int | None] = info["dims"]
    params = {}
    for name, value in parts[0]["params"].items():
        d = dims.get(name)
        params[name] = value if d is None else torch.cat([p["params"][name] for p in parts], d)
    opt = parts[0]["optimizer"]
    state = {}
    for idx, entry in opt["state"].items():
        d = dims[info["order"][int(idx)]]
        state[idx] = {
            key: _join(value, [p["optimizer"]["state"][idx][key] for p in parts], d)
            for key, value in entry.items()
        }
    merged = {"params": params, "optimizer": {"state": state, "param_groups": opt["param_groups"]}}
    if "loss_scale" in parts[0]:  # fp16's scaler state, alike on every rank (worker/precision.py)
        merged["loss_scale"] = parts[0]["loss_scale"]
    return merged


def _join(first: Any, values: list[Any], dim: int | None) -> Any:
    # Per-parameter optimizer tensors (Adam's moments, SGD's momentum) are cut like their
    # parameter; scalars such as Adam's step count are alike on every rank.
    if dim is None or not isinstance(first, torch.Tensor) or first.dim() == 0:
        return first
    return torch.cat(values, dim)


def local_part(
    whole: dict[str, Any], dims: dict[str, int | None], order: Sequence[str], tp_rank: int, tp: int
) -> dict[str, Any]:
    """Cut a whole layer state for tp position ``tp_rank`` of ``tp`` (the inverse of merging)."""
    whole = merge_layer_states([whole]) if SHARD_KEY in whole else whole

    def cut(value: Any, dim: int | None) -> Any:
        if dim is None or not isinstance(value, torch.Tensor) or value.dim() == 0:
            return value
        return torch.chunk(value, tp, dim)[tp_rank].clone()

    params = {name: cut(v, dims.get(name)) for name, v in whole["params"].items()}
    opt = whole["optimizer"]
    state = {
        idx: {k: cut(v, dims[order[int(idx)]]) for k, v in entry.items()}
        for idx, entry in opt["state"].items()
    }
    part = {"params": params, "optimizer": {"state": state, "param_groups": opt["param_groups"]}}
    if "loss_scale" in whole:  # fp16's scaler state, alike on every rank (worker/precision.py)
        part["loss_scale"] = whole["loss_scale"]
    return part


def load_local(
    layer: nn.Module, optimizer: torch.optim.Optimizer, whole: dict[str, Any], spec: RankSpec
) -> None:
    """Load a whole (or this stage's merged) layer state into a tensor-parallel layer."""
    named = dict(layer.named_parameters())
    dims = shard_dims(layer)
    order = optimizer_order(layer, optimizer)
    # Copies: the caller may hand several ranks the same (e.g. shared-memory) tensors, and the
    # optimizer updates its state in place.
    part = _local(local_part(whole, dims, order, spec.tp_rank, spec.tp))
    with torch.no_grad():
        for name, p in named.items():
            target = p.to_local() if isinstance(p, DTensor) else p
            target.copy_(part["params"][name])
        for name, b in layer.named_buffers():
            b.copy_(part["params"][name])
    state = {}
    for idx, entry in part["optimizer"]["state"].items():
        p = named[order[int(idx)]]
        state[idx] = {k: _as_param_like(v, p) for k, v in entry.items()}
    optimizer.load_state_dict({"state": state, "param_groups": part["optimizer"]["param_groups"]})


def _as_param_like(value: Any, param: torch.Tensor) -> Any:
    if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.dim() > 0:
        return DTensor.from_local(
            value.to(param.device), param.device_mesh, param.placements, run_check=False
        )
    return value


def grad_contribution(param: nn.Parameter, spec: RankSpec) -> torch.Tensor:
    """This rank's share of the parameter's whole-shape gradient for a sum over holders.

    At tp 1 the gradient itself. In a tp group a split parameter contributes its slice at its
    place (zeros elsewhere) and a replicated one is counted by tp position 0 only (the others
    hold the same gradient), so the sum over all holders is the sum over replicas.
    """
    grad = param.grad
    if not isinstance(param, DTensor):
        # Whole on every rank of the stage (e.g. a norm): counted once per replica.
        if grad is None or spec.tp_rank != 0:
            return torch.zeros_like(param)
        return grad
    local = param.to_local()
    placement = param.placements[0]
    local_grad = grad.to_local() if isinstance(grad, DTensor) else grad
    if local_grad is None:
        local_grad = torch.zeros_like(local)
    if isinstance(placement, Shard):
        d = placement.dim
        shape = list(local.shape)
        shape[d] *= spec.tp
        whole = torch.zeros(shape, dtype=local.dtype, device=local.device)
        torch.chunk(whole, spec.tp, d)[spec.tp_rank].copy_(local_grad)
        return whole
    return local_grad if spec.tp_rank == 0 else torch.zeros_like(local_grad)


def set_grad_from_whole(param: nn.Parameter, whole: torch.Tensor, spec: RankSpec) -> None:
    """Give the parameter the summed whole-shape gradient (its own slice under tp)."""
    if not isinstance(param, DTensor):
        param.grad = whole.view_as(param).clone()
        return
    placement = param.placements[0]
    whole = whole.view(param.shape)
    local = (
        torch.chunk(whole, spec.tp, placement.dim)[spec.tp_rank]
        if isinstance(placement, Shard)
        else whole
    )
    placements = [placement if isinstance(placement, Shard) else Replicate()]
    param.grad = DTensor.from_local(local.clone(), param.device_mesh, placements, run_check=False)

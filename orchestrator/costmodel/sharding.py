"""Sharded data parallel in the cost model: memory split across a shard group, and the
all-gather / reduce-scatter it costs.

A layer's *shard group* is the set of its holders (one stage per replica) whose stages shard it;
with ``k`` of them each keeps ``1/k`` of what the level shards (Rajbhandari et al. 2020, "ZeRO",
section 5):

- ``optimizer`` (ZeRO-1): optimizer state (fp32 master and moments) ``/ k``;
- ``gradients`` (ZeRO-2): also gradients ``/ k``;
- ``full`` (ZeRO-3): also weights ``/ k``, plus whole weights of the layers being gathered
  (FSDP keeps the current layer and prefetches the next: two layers' weights).

Communication, per layer and step, over the slowest link of the group (``b`` bandwidth, ``P``
parameters, ``w``/``g`` bytes per weight/gradient): ZeRO-1/2 reduce-scatter gradients and
all-gather updated weights, ``(k-1)/k P (g + w) / b``, the ring all-reduce's volume when
``g == w``, so they cost what plain data parallel costs. Where some holders do not shard, the
runtime all-reduces whole gradients over every holder and the sharded ones then all-gather
their slices: that all-gather is extra. So it is on our engine at ``optimizer`` even where every
holder shards (it reduces slice by slice only at ``gradients``;
``RuntimePreset.optimizer_sharding_all_reduces``). ZeRO-3 gathers weights before the forward
and again before the backward and reduce-scatters gradients: ``(k-1)/k P (2 w + g)`` (1.5x an
all-reduce; ZeRO section 7). FSDP prefetches the next layer's weights while the current one
computes, so the gathers hide behind compute up to the stage's compute time; what does not hide
is charged. That is the regime of "Memory and Bandwidth are All You Need for Fully Sharded Data
Parallel": sharding pays where the memory it frees is needed (a model that does not fit, or a
bigger microbatch) and the link moves a step's gathers within a step's compute.

The optimizer step of a sharded holder updates its slice only: ``1/k`` of the layer's update
time.

Layer by layer (``runs_layer_by_layer``: one-stage replicas all sharding ``gradients`` or
``full``, ``RuntimePreset.layerwise_sharded_replicas``), our engine gathers a layer before its
forward and again before its backward and reduces its gradient onto the owners as its backward
ends, every microbatch round (``worker/layerwise.py``). A holder then keeps its slices, one
layer's whole gradients (``LAYERWISE_GRAD_LAYERS``) and under ``full`` one layer's whole weights
(``LAYERWISE_GATHERED_LAYERS``; no prefetch, so not FSDP's two); under ``full`` its weight slice
is the fp32 master slice its optimizer steps, counted once (:func:`layerwise_state_bytes`). The
collectives run once per round, ``R`` rounds a step (the group's largest microbatch count,
:func:`layerwise_rounds`), synchronously, so they do not hide behind compute:
``R (k-1)/k P (2 w + g)`` under ``full``, ``R (k-1)/k P g`` plus the gather of the updated
slices ``(k-1)/k P w`` under ``gradients`` (:func:`layerwise_sync_s`).

Pure: no torch or ray.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from orchestrator.costmodel.result import DeviceEstimate
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, Sharding, StageSpec

# FSDP holds the layer it computes and the one it prefetches.
GATHERED_LAYERS = 2
# Our layer-by-layer path (worker/layerwise.py) frees a layer before it gathers the next (no
# prefetch), and reduces a layer's gradient buffer before the next layer's backward starts:
# one layer of each at once (the step's memory report counts them).
LAYERWISE_GATHERED_LAYERS = 1
LAYERWISE_GRAD_LAYERS = 1


def runs_layer_by_layer(plan: Plan) -> bool:
    """Whether our engine runs ``plan``'s sharding layer by layer (``worker/layerwise.py``):
    two or more replicas, each one tp-1 stage holding every layer, all sharding ``gradients``
    or all ``full``. Each holder then runs all its layers forward and backward per microbatch,
    so per-layer gathers and reductions line up across holders (the ones with fewer
    microbatches run empty rounds). Other sharded plans gather once a step and reduce after the
    backward."""
    if len(plan.replicas) < 2:
        return False
    stages = [rep.stages[0] for rep in plan.replicas if len(rep.stages) == 1]
    if len(stages) != len(plan.replicas):
        return False
    levels = {st.sharding for st in stages}
    if len(levels) != 1 or not levels.pop().shards_gradients:
        return False
    return all(st.tp == 1 and st.layers == (0, plan.num_layers) for st in stages)


def state_parts_bytes(
    model: ModelSpec, training: TrainingSpec, layer: int, tp: int
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes of ``layer`` on one of its ``tp`` devices."""
    params = model.layer_params(layer) / tp
    w = model.dtype.size_bytes if training.mixed_precision else 4
    g = training.grad_bytes_per_param(model.dtype)
    total = training.state_bytes_per_param(model.dtype)
    return params * w, params * g, params * (total - w - g)


def master_bytes(model: ModelSpec, training: TrainingSpec, layer: int, tp: int) -> float:
    """fp32 weights a sharded holder's optimizer steps beyond the state (per device): under
    fp32 training the state has no master copy (an unsharded optimizer steps the weights in
    place), while a sharded holder steps an fp32 copy of its slice (worker/sharding.py's
    ``pieces``, as ZeRO keeps its fp32 partition); :func:`shard_of` divides it by ``k``. Zero
    under 16-bit mixed precision, whose state already holds the fp32 master."""
    has_master = training.mixed_precision and model.dtype.size_bytes == 2
    return 0.0 if has_master else model.layer_params(layer) / tp * 4


def sharded_state_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    layer: int,
    tp: int,
    level: Sharding,
    k: int,
    whole_grads: bool = False,
) -> float:
    """State bytes of ``layer`` on one device of a shard group of ``k`` at ``level``
    (without the gathered working weights of ``full``; see :func:`gathered_bytes`) at the
    step's peak; ``whole_grads``: see :func:`shard_of`."""
    master = master_bytes(model, training, layer, tp)
    parts = state_parts_bytes(model, training, layer, tp)
    return shard_of(*parts, level, k, whole_grads, master)


def shard_of(
    weights: float,
    grads: float,
    opt: float,
    level: Sharding,
    k: int,
    whole_grads: bool = False,
    master: float = 0.0,
) -> float:
    """:func:`sharded_state_bytes` from a layer's (weights, gradients, optimizer) bytes.
    ``whole_grads``: the runtime reduces a sharded layer's gradients only after the backward
    (``RuntimePreset.whole_gradients_at_peak``), so at the step's peak every holder still holds
    them whole, whatever the level; the slices save memory only between steps. ``master``:
    :func:`master_bytes`, held as one more slice of optimizer state."""
    if k <= 1 or level is Sharding.NONE:
        return weights + grads + opt
    kept_grads = grads if whole_grads else grads / k
    opt += master
    if level is Sharding.OPTIMIZER:
        return weights + grads + opt / k
    if level is Sharding.GRADIENTS:
        return weights + kept_grads + opt / k
    return weights / k + kept_grads + opt / k


def layerwise_rounds(plan: Plan) -> int:
    """Rounds of per-layer collectives a layer-by-layer step runs on every holder: the largest
    microbatch count among the replicas (those with fewer run empty rounds)."""
    return max(math.ceil(rep.batch_size / plan.microbatch_size) for rep in plan.replicas)


def layerwise_state_bytes(
    model: ModelSpec, training: TrainingSpec, layers: Sequence[int], level: Sharding, k: int
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes one of ``k`` layer-by-layer holders of
    ``layers`` holds at the step's peak: the slices of the state (the fp32 master slice with
    the optimizer state), ``LAYERWISE_GRAD_LAYERS`` of the largest layers' whole gradients, and
    the whole weights (``gradients``) or under ``full`` ``LAYERWISE_GATHERED_LAYERS`` layers'
    whole weights, whose slice the master is (where there is no separate master, the 16-bit
    weights, a slice of them is kept besides)."""
    parts = [state_parts_bytes(model, training, i, 1) for i in layers]
    masters = [master_bytes(model, training, i, 1) for i in layers]
    weights = sum(p[0] for p in parts)
    grads = sum(p[1] for p in parts) / k
    grads += sum(sorted((p[1] for p in parts), reverse=True)[:LAYERWISE_GRAD_LAYERS])
    opt = (sum(p[2] for p in parts) + sum(masters)) / k
    if level is Sharding.FULL:
        largest = sorted((p[0] for p in parts), reverse=True)[:LAYERWISE_GATHERED_LAYERS]
        weights = sum(largest) + (0.0 if sum(masters) else weights / k)
    return weights, grads, opt


def layerwise_sync_s(
    weights: float, grads: float, level: Sharding, k: int, rounds: int, bandwidth: float
) -> float:
    """Seconds a layer-by-layer holder spends on one layer's collectives in a step beyond plain
    data parallel's ring all-reduce (``weights``/``grads``: the layer's bytes)."""
    frac = (k - 1) / k
    if level is Sharding.FULL:
        moved = rounds * frac * (2 * weights + grads)
    else:
        moved = rounds * frac * grads + frac * weights
    return (moved - 2 * frac * grads) / bandwidth


def layerwise_segments(numels: Sequence[int], k: int) -> list[list[int]]:
    """Per layer (of ``numels`` elements each, in order), the element counts of the owners'
    slices that meet it: the group's flat parameters cut into ``k`` contiguous slices of sizes
    differing by at most one (``worker/topology.shard_bounds``). The layer-by-layer path issues
    one collective per such piece (``worker/layerwise.py``)."""
    total = sum(numels)
    base, extra = divmod(total, k)
    bounds, lo = [], 0
    for owner in range(k):
        hi = lo + base + (1 if owner < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    out, start = [], 0
    for n in numels:
        end = start + n
        out.append(
            [min(hi, end) - max(lo, start) for lo, hi in bounds if max(lo, start) < min(hi, end)]
        )
        start = end
    return out


def layerwise_collectives_s(
    numels: Sequence[int],
    weight_bytes: float,
    grad_bytes: float,
    level: Sharding,
    k: int,
    rounds: int,
    gather: tuple[float, float],
    reduce: tuple[float, float],
) -> float:
    """Seconds a layer-by-layer holder spends in its collectives a step at a measured cost per
    collective (``gather`` and ``reduce``: (latency seconds, bytes per second) of one,
    ``worker/collective_cost.py``): every round, per owner's piece of each layer
    (:func:`layerwise_segments`), a reduction of its gradients and under ``full`` two gathers
    of its weights (before the forward and before the backward); under ``gradients`` the
    step's gather of the updated slices, one per owner. Issued synchronously from the layers'
    hooks, none hides behind compute."""
    pieces = [n for layer in layerwise_segments(numels, k) for n in layer]
    reduce_s = sum(reduce[0] + n * grad_bytes / reduce[1] for n in pieces)
    gather_s = sum(gather[0] + n * weight_bytes / gather[1] for n in pieces)
    if level is Sharding.FULL:
        return rounds * (reduce_s + 2 * gather_s)
    updated_s = k * gather[0] + sum(numels) * weight_bytes / gather[1]
    return rounds * reduce_s + updated_s


def gathered_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    layers: Sequence[int],
    tp: int,
    gathered_layers: int | None = GATHERED_LAYERS,
) -> float:
    """Whole weights ZeRO-3 holds at once: the largest ``gathered_layers`` of the stage's
    (None: all of them, a runtime that gathers the step's parameters once)."""
    sizes = sorted((state_parts_bytes(model, training, i, tp)[0] for i in layers), reverse=True)
    return sum(sizes if gathered_layers is None else sizes[:gathered_layers])


def sync_extra_s(
    model: ModelSpec,
    training: TrainingSpec,
    layer: int,
    tp: int,
    level: Sharding,
    k: int,
    all_sharded: bool,
    bandwidth_bytes_per_s: float,
) -> tuple[float, float]:
    """(extra seconds that cannot overlap, seconds of gathers that can hide behind compute)
    one sharded holder spends on ``layer`` beyond plain data parallel's all-reduce."""
    if k <= 1 or level is Sharding.NONE:
        return 0.0, 0.0
    weights, grads, _ = state_parts_bytes(model, training, layer, tp)
    frac = (k - 1) / k
    if level is Sharding.FULL:
        # Two gathers of the weights (forward, backward) overlap with compute; the
        # reduce-scatter replaces half of the all-reduce, the gather of updated weights is
        # not needed (each rank keeps its slice).
        gathers = 2 * frac * weights / bandwidth_bytes_per_s
        saved = frac * weights / bandwidth_bytes_per_s if all_sharded else 0.0
        return -saved, gathers
    if all_sharded:
        # reduce-scatter + all-gather = the all-reduce volume, up to the byte widths
        return frac * (weights - grads) / bandwidth_bytes_per_s, 0.0
    return frac * weights / bandwidth_bytes_per_s, 0.0


def apply(
    plan: Plan,
    devices: Sequence[DeviceEstimate],
    model: ModelSpec,
    training: TrainingSpec,
    holder_bandwidth: Callable[[list[StageSpec]], float],
    gathered_layers: int | None = GATHERED_LAYERS,
    whole_grads: bool = False,
    zero1_all_reduces: bool = False,
    layerwise: bool = False,
    collective: tuple[tuple[float, float], tuple[float, float]] | None = None,
) -> list[DeviceEstimate]:
    """The devices' estimates with sharded stages' memory and synchronisation adjusted.

    ``gathered_layers`` is the runtime's (``RuntimePreset.gathered_layers``): with None, a
    ``full`` stage gathers its whole parameters once before the step (not before each forward
    and backward), so it moves what ``gradients`` moves and holds every layer's whole weights
    during the step. ``zero1_all_reduces``
    (``RuntimePreset.optimizer_sharding_all_reduces``): at ``optimizer`` the runtime all-reduces
    whole gradients even where every holder shards, so the gather of the updated slices is
    charged on top, as where some holders do not shard. ``layerwise``
    (``RuntimePreset.layerwise_sharded_replicas``): plans that :func:`runs_layer_by_layer` are
    charged the layer-by-layer path's memory and collectives instead; with ``collective``
    (the (latency seconds, bytes per second) of one of its gathers and of one of its
    reductions, as the profiler measured them for our runtime: ``CostTables.collective_cost``)
    they are charged per collective (:func:`layerwise_collectives_s`) in place of the
    network's bandwidth; on the once-a-step path the gather of the updated slices (where the
    runtime all-reduces whole gradients) is charged at no less than the measured gathers: one
    per slice, ``k`` latencies per shard group and the weights' bytes at the gather's rate.
    """
    out = list(devices)
    if not any(st.sharding is not Sharding.NONE for rep in plan.replicas for st in rep.stages):
        return out  # the common case: nothing to adjust, no per-layer scan
    # tied weights keep the once-a-step path on our engine (worker/layerwise.applies)
    if layerwise and runs_layer_by_layer(plan) and not model.tie_embeddings:
        return _apply_layerwise(plan, out, model, training, holder_bandwidth, collective)
    index = {(d.replica, d.stage): i for i, d in enumerate(out)}
    # Per (layer, tp) and per sync case: identical holders (whole replicas of one shape) would
    # otherwise recompute the same bytes and seconds once each.
    parts: dict[tuple[int, int], tuple[float, float, float]] = {}
    syncs: dict[tuple[object, ...], tuple[float, float]] = {}
    bandwidths: dict[tuple[tuple[int, int], ...], float] = {}

    def parts_of(layer: int, tp: int) -> tuple[float, float, float]:
        found = parts.get((layer, tp))
        if found is None:
            found = parts[(layer, tp)] = state_parts_bytes(model, training, layer, tp)
        return found

    gather = collective[0] if collective is not None else None
    gathered: list[set[tuple[tuple[int, int], ...]]] = [set() for _ in out]  # groups charged
    saved_bytes = [0.0] * len(out)
    extra_s = [0.0] * len(out)
    hideable_s = [0.0] * len(out)
    update_kept = [1.0] * len(out)  # fraction of the stage's update time still spent
    for layer in range(plan.num_layers):
        holders = [
            (r, s, st)
            for r, rep in enumerate(plan.replicas)
            for s, st in enumerate(rep.stages)
            if st.layers[0] <= layer < st.layers[1]
        ]
        sharded = [(r, s, st) for r, s, st in holders if st.sharding is not Sharding.NONE]
        k = len(sharded)
        if k < 2:
            continue
        level = sharded[0][2].sharding
        # Layers held by the same stages share a bandwidth (the stages live through the call).
        holder_key = tuple((r, s) for r, s, _ in sharded)
        bw = bandwidths.get(holder_key)
        if bw is None:
            bw = bandwidths[holder_key] = holder_bandwidth([st for _, _, st in sharded])
        # one gather a step (after the update, before the next forward): ZeRO-2's traffic
        timed = Sharding.GRADIENTS if level is Sharding.FULL and gathered_layers is None else level
        for r, s, st in sharded:
            i = index[(r, s)]
            weights, grads, opt = parts_of(layer, st.tp)
            master = master_bytes(model, training, layer, st.tp)
            kept = shard_of(weights, grads, opt, level, k, whole_grads, master)
            saved_bytes[i] += weights + grads + opt - kept
            # Slices reduced in place of the all-reduce only where every holder shards (and,
            # at ``optimizer``, only where the runtime reduce-scatters there).
            reduced = k == len(holders) and (timed.shards_gradients or not zero1_all_reduces)
            key = (layer, st.tp, timed, k, reduced, bw)
            found = syncs.get(key)
            if found is None:
                found = syncs[key] = sync_extra_s(
                    model, training, layer, st.tp, timed, k, reduced, bw
                )
            fixed, hideable = found
            if gather is not None and not reduced and timed is not Sharding.FULL:
                # The gather of the updated slices at the measured broadcast: one per slice
                # (the group's latency once per device), the layer's weights at its rate.
                fixed = max(fixed, weights / gather[1])
                if holder_key not in gathered[i]:
                    gathered[i].add(holder_key)
                    fixed += k * gather[0]
            extra_s[i] += fixed
            hideable_s[i] += hideable
            update_kept[i] -= (1 - 1 / k) / (st.layers[1] - st.layers[0])
    for i, d in enumerate(out):
        if saved_bytes[i] == 0.0 and extra_s[i] == 0.0 and hideable_s[i] == 0.0:
            continue
        stage = plan.replicas[d.replica].stages[d.stage]
        memory = d.memory_bytes - saved_bytes[i]
        if stage.sharding is Sharding.FULL:
            memory += gathered_bytes(
                model, training, range(*stage.layers), stage.tp, gathered_layers
            )
        # Prefetched gathers hide behind the stage's compute; the rest shows.
        exposed = max(0.0, hideable_s[i] - d.compute_s)
        out[i] = replace(
            d,
            memory_bytes=memory,
            # update time spread evenly over the stage's layers (the tables keep it per stage)
            update_s=d.update_s * max(update_kept[i], 0.0),
            allreduce_s=max(0.0, d.allreduce_s + extra_s[i]) + exposed,
        )
    return out


def _apply_layerwise(
    plan: Plan,
    devices: list[DeviceEstimate],
    model: ModelSpec,
    training: TrainingSpec,
    holder_bandwidth: Callable[[list[StageSpec]], float],
    collective: tuple[tuple[float, float], tuple[float, float]] | None = None,
) -> list[DeviceEstimate]:
    """:func:`apply` for a plan whose holders run layer by layer (each a whole one-stage
    replica, all at one level): the same terms on every holder."""
    stages = [rep.stages[0] for rep in plan.replicas]
    level, k = stages[0].sharding, len(stages)
    layers = range(plan.num_layers)
    held = sum(layerwise_state_bytes(model, training, layers, level, k))
    whole = sum(sum(state_parts_bytes(model, training, i, 1)) for i in layers)
    bandwidth = holder_bandwidth(stages)
    rounds = layerwise_rounds(plan)
    if collective is not None:
        # Measured per collective: the whole of the path's communication (the data-parallel
        # all-reduce the tables charged is not what it runs).
        numels = [model.layer_params(i) for i in layers]
        w = model.dtype.size_bytes if training.mixed_precision else 4
        g = training.grad_bytes_per_param(model.dtype)
        sync_s = layerwise_collectives_s(numels, w, g, level, k, rounds, *collective)
        return [_layerwise_device(d, whole, held, k, sync_s) for d in devices]
    extra_s = 0.0
    for i in layers:
        weights, grads, _ = state_parts_bytes(model, training, i, 1)
        extra_s += layerwise_sync_s(weights, grads, level, k, rounds, bandwidth)
    return [_layerwise_device(d, whole, held, k, d.allreduce_s + extra_s) for d in devices]


def _layerwise_device(
    d: DeviceEstimate, whole: float, held: float, k: int, sync_s: float
) -> DeviceEstimate:
    return replace(
        d,
        memory_bytes=d.memory_bytes - whole + held,
        update_s=d.update_s / k,
        allreduce_s=max(0.0, sync_s),
    )

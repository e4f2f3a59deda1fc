"""Measure per-layer forward, backward and update seconds, and memory, on the local device.

For each planner layer and candidate microbatch size: median seconds of forward, backward and
the optimizer update (``warmup`` untimed runs, then ``repeats`` timed), the bytes autograd saves
for backward (counted by a saved-tensors hook, so the same on CPU and GPU) and the parameter
bytes. The result is the planner's own :class:`~orchestrator.spec.profiles.ProfileFile`.

Emulation: with ``slowdown_factor > 1`` every time is multiplied by the factor and the file says
``emulated: true``; that is how a CPU node labelled as a slower device type is profiled.

:class:`ProfileCache` keeps one file per (model, device type); its key hashes the factory, its
arguments, every layer's parameter names and shapes, the microbatch sizes, the factor and the
torch version, so a changed model is profiled again.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from orchestrator.errors import SpecError
from orchestrator.spec.profiles import (
    LayerTiming,
    ProfileEntry,
    ProfileFile,
    RuntimeConstants,
    read_profile,
)
from orchestrator.worker.call_terms import CallOverhead, measure_call_overhead
from orchestrator.worker.data import DataConfig, make_dataset
from orchestrator.worker.in_context import InContextRatio, measure_in_context
from orchestrator.worker.layers import build_layers
from orchestrator.worker.memory_account import ActivationAccount, DeviceMemory, state_bytes
from orchestrator.worker.model_api import LayeredModel, build_model
from orchestrator.worker.optim import make_optimizer
from orchestrator.worker.runtime_terms import RuntimeTerms, measure_runtime_terms

# Bumped when how the profiler measures changes, so cached profiles of the old way are not reused.
MEASUREMENT_METHOD = (
    "v8: emulated times from the least thread CPU time, scaled to the stage call in context;"
    " 16-bit activations; runtime time terms; layers timed without hooks, backward from a ready"
    " gradient; per-call stage terms on real devices; gloo collectives fitted over four sizes"
)


@dataclass(frozen=True)
class ProfileRequest:
    """What to profile: a model by factory, on which device type, for which microbatches."""

    model_factory: str
    model_kwargs: dict[str, Any]
    device_type: str
    microbatch_sizes: tuple[int, ...]
    data: DataConfig
    optimizer: str = "adam"
    slowdown_factor: float = 1.0  # emulation; 1.0 = real speed
    warmup: int = 1
    repeats: int = 3
    seed: int = 0


def profile(request: ProfileRequest, device: torch.device | None = None) -> ProfileFile:
    """Measure every planner layer of the model at every microbatch size."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if request.slowdown_factor != 1.0 and device.type == "cuda":
        raise SpecError(
            "emulated slow-down requested while profiling a real GPU",
            field="slowdown_factor",
            fix="emulation is for CPU nodes only; profile the GPU at its own speed",
        )
    framework_bytes = measure_framework_bytes(device)  # before any model state exists
    model = build_model(request.model_factory, dict(request.model_kwargs))
    layers = build_layers(model, range(model.num_planner_layers), request.seed, device)
    dataset = make_dataset(request.data, request.seed)
    entries = []
    in_context: list[str] = []  # the scaling applied per microbatch size, for the source line
    for mbs in request.microbatch_sizes:
        inputs, targets = dataset.batch(0, mbs, 0, mbs)
        timings = {
            i: _profile_layer(model, layers, i, inputs.to(device), targets.to(device), request)
            for i in range(model.num_planner_layers)
        }
        if request.slowdown_factor != 1.0:  # emulated: scaled to the stage call as it runs
            timings, ratio = _in_context(
                model, layers, inputs.to(device), targets.to(device), timings, request
            )
            in_context.append(f"mb{mbs} x{ratio.forward:.3f}/x{ratio.backward:.3f}")
        entries.append(ProfileEntry(microbatch_size=mbs, tp=1, layers=timings))
    terms = _runtime_terms(model, layers, dataset, request, device)
    emulated = request.slowdown_factor != 1.0
    # Emulated: the in-context ratio already holds what a call costs beyond its layers.
    calls = None if emulated else _call_overhead(model, layers, dataset, request, device)
    return ProfileFile(
        model=model.name,
        device_type=request.device_type,
        sequence_length=request.data.sequence_length,
        dtype="fp32",
        source=_source(device, request.slowdown_factor, in_context),
        emulated=emulated,
        entries=entries,
        runtime=RuntimeConstants(
            framework_bytes=framework_bytes,
            state_bytes_per_param=_state_bytes_per_param(layers, request.optimizer),
            optimizer=request.optimizer,
            source=_constants_source(device),
            microbatch_overhead_s=terms.microbatch_overhead_s,
            step_overhead_s=terms.step_overhead_s,
            call_forward_s=calls.forward_s if calls is not None else None,
            call_backward_s=calls.backward_s if calls is not None else None,
        ),
    )


def _in_context(
    model: LayeredModel,
    layers: dict[int, nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    timings: dict[int, LayerTiming],
    request: ProfileRequest,
) -> tuple[dict[int, LayerTiming], InContextRatio]:
    """Each layer's emulated forward and backward scaled by the ratio of the whole model as one
    stretched stage call to the sum of the layers timed alone (``worker/in_context.py``)."""
    factor = request.slowdown_factor
    order = sorted(timings)
    ratio = measure_in_context(
        model,
        layers,
        inputs,
        targets,
        factor,
        [timings[i].forward_s / factor for i in order],
        [timings[i].backward_s / factor for i in order],
    )
    scaled = {
        i: t.model_copy(
            update={
                "forward_s": t.forward_s * ratio.forward,
                "backward_s": t.backward_s * ratio.backward,
            }
        )
        for i, t in timings.items()
    }
    return scaled, ratio


def _call_overhead(
    model: LayeredModel,
    layers: dict[int, nn.Module],
    dataset: Any,
    request: ProfileRequest,
    device: torch.device,
) -> CallOverhead | None:
    """The per-call seconds of a stage's forward and backward (``worker/call_terms.py``), at the
    smallest candidate microbatch size: a fixed cost, measured with the least compute around it."""
    mbs = min(request.microbatch_sizes)
    inputs, _ = dataset.batch(0, mbs, 0, mbs)
    # As many repeats as the layers' own times (emulated: the least of many, worker/emulation.py).
    repeats = max(9, request.repeats)
    return measure_call_overhead(
        model, layers, inputs.to(device), request.slowdown_factor, repeats=repeats
    )


def _runtime_terms(
    model: LayeredModel,
    layers: dict[int, nn.Module],
    dataset: Any,
    request: ProfileRequest,
    device: torch.device,
) -> RuntimeTerms:
    """The rank's time outside its pieces (``worker/runtime_terms.py``), at the smallest
    candidate microbatch size: the terms are fixed costs, and the smallest size measures them
    with the least stretched compute around them."""
    mbs = min(request.microbatch_sizes)
    many = 4  # few: at a 16x emulated stretch each microbatch costs a second
    inputs, targets = dataset.batch(0, many * mbs, 0, many * mbs)
    return measure_runtime_terms(
        model,
        layers,
        inputs.to(device),
        targets.to(device),
        mbs,
        request.slowdown_factor,
        request.optimizer,
        many=many,
        warmup=1,
        repeats=3,
    )


def measure_framework_bytes(device: torch.device) -> int:
    """What this worker process occupies on ``device`` before any model state: on CUDA the
    context outside the caching allocator (after a matmul has loaded cuBLAS and its workspace);
    on the CPU the process's resident memory (Python, torch, the runtime's own modules)."""
    if device.type == "cuda":
        a = torch.ones(64, 64, device=device)
        (a @ a).sum().item()
        del a
        torch.cuda.empty_cache()
        context = DeviceMemory(device).context_bytes
        return int(context or 0)
    return _resident_bytes()


def _resident_bytes() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the peak resident size instead
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _state_bytes_per_param(layers: dict[int, nn.Module], optimizer_name: str) -> float:
    """Weights + gradients + optimizer state per parameter after one update of every layer,
    counted as a running rank counts them (``worker/memory_account.py``)."""
    optimizers = []
    for layer in layers.values():
        for p in layer.parameters():
            p.grad = torch.zeros_like(p)
        opt = make_optimizer(optimizer_name, layer.parameters(), 1e-6)
        opt.step()  # creates the optimizer's state (Adam's moments appear on the first step)
        optimizers.append(opt)
    weights, grads, state = state_bytes(layers.values(), optimizers)
    params = sum(p.numel() for layer in layers.values() for p in layer.parameters())
    return (weights + grads + state) / params


def _constants_source(device: torch.device) -> str:
    where = "CUDA context outside the allocator" if device.type == "cuda" else "process RSS"
    return (
        f"measured by orchestrator.worker.profiler: framework = {where} before the model; "
        "state = counted storages after one update; time terms = a one-stage step through the "
        "runtime's stage runner, outside its timed pieces (worker/runtime_terms.py); call terms "
        "= intercept of chains of k blocks timed as one call (worker/call_terms.py)"
    )


def _profile_layer(
    model: LayeredModel,
    layers: dict[int, nn.Module],
    index: int,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    request: ProfileRequest,
) -> LayerTiming:
    layer = layers[index]
    is_last = index == model.num_planner_layers - 1
    optimizer = make_optimizer(request.optimizer, layer.parameters(), 1e-6)
    sync = _sync_fn(inputs.device)
    # Emulated: the least CPU time of this thread over the repeats, as the emulated run stretches
    # it (worker/emulation.py), so profiles agree with runs whatever else shares the host. Real
    # devices: the median of the wall clock.
    emulated = request.slowdown_factor != 1.0
    clock = time.thread_time if emulated else time.perf_counter
    pick = min if emulated else statistics.median
    forward_s, backward_s, update_s = [], [], []
    x = _layer_input(model, layers, index, inputs)
    saved_bytes = _saved_bytes(model, layer, x, targets, is_last)
    shape = model.boundary_shape(inputs.shape[0])
    grad = None if is_last else torch.ones(shape, dtype=model.boundary_dtype, device=x.device)
    for run in range(request.warmup + request.repeats):
        # Timed as a one-layer stage runs it (worker/pipeline.py): no hooks around the forward,
        # the backward from a gradient already at hand.
        x = _layer_input(model, layers, index, inputs)
        start = clock()
        out = layer(x)
        if is_last:
            out = model.loss(out, targets)
        sync()
        mid = clock()
        out.backward(grad)
        sync()
        end = clock()
        optimizer.step()
        sync()
        done = clock()
        optimizer.zero_grad(set_to_none=True)
        if run >= request.warmup:
            forward_s.append(mid - start)
            backward_s.append(end - mid)
            update_s.append(done - end)
    factor = request.slowdown_factor
    return LayerTiming(
        activation_bytes_16bit=_saved_bytes_16bit(model, layers, index, inputs, targets, False),
        activation_bytes_16bit_boundary=_saved_bytes_16bit(
            model, layers, index, inputs, targets, True
        ),
        forward_s=factor * pick(forward_s),
        backward_s=factor * pick(backward_s),
        update_s=factor * pick(update_s),
        activation_bytes=saved_bytes,
        param_bytes=sum(p.numel() * p.element_size() for p in layer.parameters()),
    )


def _saved_bytes(
    model: LayeredModel, layer: nn.Module, x: torch.Tensor, targets: torch.Tensor, is_last: bool
) -> int:
    """Bytes one forward of ``layer`` saves for backward (an untimed run: the counting hooks
    cost time a running rank does not spend)."""
    counter = _SavedBytes(layer)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        out = layer(x)
        if is_last:
            out = model.loss(out, targets)
    del out
    return counter.total_bytes


def _saved_bytes_16bit(
    model: LayeredModel,
    layers: dict[int, nn.Module],
    index: int,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    boundary_input: bool,
) -> int:
    """Bytes one forward of layer ``index`` saves for backward under 16-bit autocast, counted as
    a running rank counts them (``worker/memory_account.py``: weight copies apart); with
    ``boundary_input`` the layer's input arrives in 16 bits, as a pipeline transfer sends it."""
    layer = layers[index]
    device = inputs.device
    dtype = torch.bfloat16
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        dtype = torch.float16  # the same sizes
    account = ActivationAccount(layer.parameters())
    x = _layer_input(model, layers, index, inputs)
    if boundary_input and index > 0:
        x = x.detach().to(dtype).requires_grad_(True)
    with torch.autocast(device.type, dtype=dtype), account.saving(0):
        out = layer(x)
        if index == model.num_planner_layers - 1:
            out = model.loss(out, targets)
    del out
    return account.microbatch_peak_bytes


def _layer_input(
    model: LayeredModel, layers: dict[int, nn.Module], index: int, inputs: torch.Tensor
) -> torch.Tensor:
    """Layer 0 takes the token batch; later layers a fresh activation that requires grad."""
    if index == 0:
        return inputs
    with torch.no_grad():
        x = layers[0](inputs)  # realistic values (LayerNorm statistics), not just the shape
    assert tuple(x.shape) == tuple(model.boundary_shape(inputs.shape[0]))
    return x.detach().requires_grad_(True)


class _SavedBytes:
    """Saved-tensors hook pair that adds up what autograd keeps for backward."""

    def __init__(self, layer: nn.Module) -> None:
        self.total_bytes = 0
        # Parameters (and views of them, like a transposed weight) are not activations.
        self._seen = {p.untyped_storage().data_ptr() for p in layer.parameters()}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        ptr = tensor.untyped_storage().data_ptr()
        if ptr not in self._seen:
            self._seen.add(ptr)
            self.total_bytes += tensor.untyped_storage().nbytes()
        return tensor

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def _sync_fn(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _source(device: torch.device, factor: float, in_context: list[str] | None = None) -> str:
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    text = f"measured by orchestrator.worker.profiler on {what}, torch {torch.__version__}"
    if factor != 1.0:
        text += f"; emulated: times stretched x{factor:g}"
    if in_context:  # forward/backward ratios of the stage call to the layers timed alone
        text += "; scaled to the stage call in context: " + ", ".join(in_context)
    return text


class ProfileCache:
    """Profiles on disk, one per (model, device type), re-measured when the model changes."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def key(self, request: ProfileRequest) -> str:
        """Hash of everything that changes the measurement, including the layers' shapes."""
        model = build_model(request.model_factory, dict(request.model_kwargs))
        shapes = [
            [(name, list(p.shape)) for name, p in model.build_layer(i).named_parameters()]
            for i in range(model.num_planner_layers)
        ]
        payload = {
            "factory": request.model_factory,
            "kwargs": request.model_kwargs,
            "shapes": shapes,
            "microbatch_sizes": list(request.microbatch_sizes),
            "sequence_length": request.data.sequence_length,
            "optimizer": request.optimizer,
            "slowdown_factor": request.slowdown_factor,
            "torch": torch.__version__,
            "method": MEASUREMENT_METHOD,
        }
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def path(self, request: ProfileRequest, model_name: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)
        return self.root / safe / f"{request.device_type}-{self.key(request)}.json"

    def get_or_profile(
        self, request: ProfileRequest, device: torch.device | None = None
    ) -> tuple[ProfileFile, bool]:
        """The cached profile if its key matches, else a fresh one (written atomically).

        Returns ``(profile, from_cache)``.
        """
        name = build_model(request.model_factory, dict(request.model_kwargs)).name
        path = self.path(request, name)
        if path.is_file():
            return read_profile(path), True
        result = profile(request, device)
        write_profile(result, path)
        return result, False


def write_profile(result: ProfileFile, path: Path) -> None:
    """Write a profile where the planner reads it (``--profiles DIR``), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    tmp.write_text(result.to_json())
    tmp.rename(path)

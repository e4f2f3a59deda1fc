"""What one rank holds in memory, counted from the tensors themselves, term by term.

The cost model predicts a rank's memory as weights + gradients + optimizer state + activations of
the microbatches in flight + the runtime's fixed footprint. This module measures the same terms on
a running rank, so each can be compared with its prediction on any device, the CPU included:

- **state**: the storages of the rank's parameters, of their gradients and of the optimizer state
  (walked tensor by tensor; a storage shared by several tensors, such as a tied or viewed weight,
  counts once). A tensor-parallel parameter counts its local shard; a sharded holder's fp32 master
  slice counts with the optimizer state it belongs to.
- **activations**: what autograd saves for the backward pass, counted by a
  ``torch.autograd.graph.saved_tensors_hooks`` pair around each microbatch's forward and released
  when that microbatch's backward has run, so the peak over the step is the activations in flight
  at the schedule's worst moment. Parameters are not activations; 16-bit copies of weights that
  autocast keeps for the backward are counted on their own (``cast_weight_bytes``, once per step:
  every microbatch shares them). Activation recompute is measured the same way: ``torch.utils.
  checkpoint`` saves a recomputed region's inputs through these (outer) hooks and the region's own
  tensors through its inner ones, so only what is kept between forward and backward is counted.
- **device** (CUDA only): ``torch.cuda.max_memory_allocated`` over the step, and the context the
  device holds beyond the caching allocator (``mem_get_info`` used bytes less reserved bytes, read
  once at set-up).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from orchestrator.spec.reports import MemoryUse


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank holds); other tensors as they are."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    """(data pointer, bytes) of ``t``'s storage; a DTensor's local shard's. Wrapper tensors whose
    own storage is not real memory (their data lives in inner tensors) count as 0 bytes."""
    t = _local(t)
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return id(t), 0


def storage_bytes(tensors: Iterable[torch.Tensor | None], seen: set[int] | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (skipping those already in ``seen``)."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        if t is None:
            continue
        ptr, nbytes = _storage_key(_local(t))
        if nbytes == 0 or ptr in seen:
            continue
        seen.add(ptr)
        total += nbytes
    return total


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def state_bytes(
    layers: Iterable[nn.Module],
    optimizers: Iterable[torch.optim.Optimizer],
    extra_optimizer_tensors: Iterable[torch.Tensor] = (),
) -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) bytes of these layers and optimizers."""
    params = [p for layer in layers for p in layer.parameters()]
    seen: set[int] = set()
    weights = storage_bytes(params, seen)
    grads = storage_bytes((p.grad for p in params), seen)
    opt_tensors = [t for opt in optimizers for t in _optimizer_tensors(opt)]
    optimizer = storage_bytes([*opt_tensors, *extra_optimizer_tensors], seen)
    return weights, grads, optimizer


def _is_weight_cast(t: torch.Tensor, params: set[int]) -> bool:
    """A copy of one of ``params`` (storage pointers) in another dtype, or a view of one:
    autocast's weight cache, saved transposed by a matmul."""
    base = t._base if t._base is not None else t
    fn = base.grad_fn
    if fn is None or type(fn).__name__ != "ToCopyBackward0":
        return False
    for nxt, _ in fn.next_functions:
        leaf = getattr(nxt, "variable", None)  # AccumulateGrad: the leaf it accumulates into
        if isinstance(leaf, torch.Tensor) and _storage_key(_local(leaf))[0] in params:
            return True
    return False


class ActivationAccount:
    """Saved-for-backward bytes per microbatch and the peak held at once during a step."""

    def __init__(self, parameters: Iterable[torch.Tensor]) -> None:
        self.track(parameters)
        self.reset()

    def track(self, parameters: Iterable[torch.Tensor]) -> None:
        """The parameters whose storage is not an activation (again after a gather moved them)."""
        self._params = {_storage_key(_local(p))[0] for p in parameters}

    def add_parameters(self, parameters: Iterable[torch.Tensor]) -> None:
        """Parameters gathered into new storage (worker/layerwise.py): not activations."""
        self._params.update(_storage_key(_local(p))[0] for p in parameters)

    def drop_parameters(self, parameters: Iterable[torch.Tensor]) -> None:
        """Parameters about to be freed: their storage may next hold an activation."""
        self._params.difference_update(_storage_key(_local(p))[0] for p in parameters)

    def reset(self) -> None:
        """Start a new step (nothing in flight)."""
        self._live_refs: dict[int, int] = {}
        self._live_nbytes: dict[int, int] = {}
        self._by_microbatch: dict[int, set[int]] = {}
        self._casts: set[int] = set()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.microbatch_peak_bytes = 0  # the most one microbatch saved
        self.in_flight = 0
        self.peak_in_flight = 0
        self.cast_weight_bytes = 0

    @contextmanager
    def saving(self, microbatch: int) -> Iterator[None]:
        """Count what autograd saves inside this block as microbatch ``microbatch``'s."""
        mine = self._by_microbatch.setdefault(microbatch, set())
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            ptr, nbytes = _storage_key(tensor)
            if nbytes == 0 or ptr in self._params or ptr in mine or ptr in self._casts:
                return tensor
            if _is_weight_cast(tensor, self._params):
                self._casts.add(ptr)
                self.cast_weight_bytes += nbytes
                return tensor
            mine.add(ptr)
            refs = self._live_refs.get(ptr, 0)
            self._live_refs[ptr] = refs + 1
            if refs == 0:
                self._live_nbytes[ptr] = nbytes
                self.live_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            return tensor

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
                yield
        finally:
            held = sum(self._live_nbytes[p] for p in mine)
            self.microbatch_peak_bytes = max(self.microbatch_peak_bytes, held)

    def release(self, microbatch: int) -> None:
        """Microbatch ``microbatch``'s backward has run: its saved tensors are freed."""
        for ptr in self._by_microbatch.pop(microbatch, set()):
            refs = self._live_refs[ptr] - 1
            if refs == 0:
                del self._live_refs[ptr]
                self.live_bytes -= self._live_nbytes.pop(ptr)
            else:
                self._live_refs[ptr] = refs
        self.in_flight -= 1


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class DeviceMemory:
    """CUDA's own figures for one device: peak allocated per step and the context's bytes."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.context_bytes: int | None = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            free, total = torch.cuda.mem_get_info(device)
            self.context_bytes = int(total - free - torch.cuda.memory_reserved(device))

    def begin_step(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_allocated_bytes(self) -> int | None:
        if self.device.type != "cuda":
            return None
        return int(torch.cuda.max_memory_allocated(self.device))


def memory_use(
    layers: Iterable[nn.Module],
    optimizers: Iterable[torch.optim.Optimizer],
    activations: ActivationAccount,
    device: DeviceMemory | None = None,
    extra_optimizer_tensors: Iterable[torch.Tensor] = (),
) -> MemoryUse:
    """The rank's memory terms now (after a step's forward and backward)."""
    weights, grads, optimizer = state_bytes(layers, optimizers, extra_optimizer_tensors)
    return MemoryUse(
        weights_bytes=weights,
        grads_bytes=grads,
        optimizer_bytes=optimizer,
        activations_peak_bytes=activations.peak_bytes,
        activation_microbatch_bytes=activations.microbatch_peak_bytes,
        microbatches_in_flight=activations.peak_in_flight,
        cast_weight_bytes=activations.cast_weight_bytes,
        device_peak_bytes=device.peak_allocated_bytes() if device is not None else None,
        context_bytes=device.context_bytes if device is not None else None,
    )

"""Memory presets: what the runtime that executes a plan keeps on each device.

The same plan needs different memory under different runtimes: the training state each parameter
carries and the fixed footprint of the framework (CUDA context, allocator pools, communication
buffers) are properties of the runtime, not of the model. A :class:`RuntimePreset` names them,
each constant with its source:

* ``orchestrator`` (our runtime, the default): the engine keeps every parameter and gradient in
  fp32 whatever it computes in (``worker/engine.py`` builds fp32 layers; bf16/fp16 is autocast
  over them), so per parameter: weights 4 B, gradients 4 B, optimizer state 8 B (Adam, AdamW: m
  and v) or 4 B (SGD momentum); under 16-bit compute, autocast's 16-bit copy of each matmul weight
  (2 B, cast once per step and saved for the backward) on top. These are counted on running ranks
  by ``worker/memory_account.py`` (``tests/dist/test_memory_account.py`` holds them to 10%). The
  framework footprint is the device type's ``framework_overhead_bytes`` unless the profiler
  measured it (``orchestrator profile`` writes a ``runtime`` section; ``CostTables`` reads it).
* ``megatron-deepspeed``: the runtime that produced Sailor's profiles and the validation runs.
  Megatron keeps, per parameter, fp16 weights (2 B) and grads (2 B), an fp32 ``main_grad``
  accumulation buffer (4 B, ``accumulate_allreduce_grads_in_fp32``), fp32 master weights, Adam m and
  v (12 B), and DeepSpeed's flat fp32 copy of the gradients it reduces (4 B): 24 B. Its fixed
  footprint (CUDA context with cuBLAS/cuDNN workspaces, NCCL communicators for the data-, tensor-
  and pipeline-parallel groups, the caching allocator's reserve) is 4 GiB: the intercept of the
  validation runs' peak memory against their model state and activations
  (``bench/costmodel_accuracy.py``, a development set of 12 runs; one constant for all of them).
  Its per-microbatch and per-step overheads are fitted on the same runs (see the constants).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.spec.devices import DeviceType, Dtype, GiB
from orchestrator.spec.model import ModelSpec, Optimizer, TrainingSpec


@dataclass(frozen=True)
class StateTerms:
    """Bytes per parameter of each training-state term a runtime keeps on a device."""

    weights: float
    grads: float
    optimizer: float
    # 16-bit copies of matmul weights held through the step (autocast's cache); embedding tables
    # are looked up, not multiplied, so they have none.
    cast_weights: float = 0.0

    @property
    def state(self) -> float:
        """Weights + gradients + optimizer state (the cast copies are counted per layer kind)."""
        return self.weights + self.grads + self.optimizer


@dataclass(frozen=True)
class RuntimePreset:
    """Per-device memory constants of the runtime that will execute a plan."""

    name: str
    # Bytes of training state per parameter; None: the TrainingSpec's own figure.
    state_bytes_per_param: float | None
    # Fixed bytes per device; None: the device type's framework_overhead_bytes.
    framework_bytes: float | None
    # Whether the data-parallel gradient all-reduce starts during the last backward (from gradient
    # hooks), so only its part beyond that backward is exposed; else it follows the pipeline.
    overlaps_gradient_allreduce: bool
    source: str
    # Fixed seconds each stage spends per microbatch beyond its compute and transfers (scheduling
    # its instructions, p2p handshakes), and per step (optimizer bookkeeping, loss-scale checks).
    microbatch_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    # Bytes per parameter the data-parallel all-reduce moves; None: the TrainingSpec's figure.
    allreduce_bytes_per_param: float | None = None
    # fp32 parameters and gradients whatever the compute dtype, with autocast's 16-bit weight
    # copies under bf16/fp16 (our engine); False: the TrainingSpec's (or the preset's) total.
    fp32_training_state: bool = False
    # Whether the profiler's measured constants (a profile's ``runtime`` section) describe this
    # runtime: they are measured on our engine, so only our preset reads them.
    measured_constants: bool = False
    # Overlapped all-reduce: gradients are reduced in buckets of about this many bytes, each
    # started once all of its layers' gradients are ready (the last bucket, holding the stage's
    # first layers, only after the whole backward); None: each layer on its own.
    grad_bucket_bytes: float | None = None
    # ``sharding: full``: how many layers' whole weights a sharded stage holds at once (FSDP: the
    # layer it computes and the one it prefetches, gathered before each forward and backward);
    # None: every layer of the stage, gathered once before the step (our engine,
    # worker/sharding.py), which moves what ZeRO-2 moves.
    gathered_layers: int | None = 2
    # Whether a layer whose holders all shard its gradients is reduced after the backward,
    # plan-wide (our engine: slice by slice, worker/topology.overlaps_grad_reduce), so no
    # gradient reduction of such a plan overlaps the backward.
    blocks_sharded_reduction: bool = False
    # Whether a sharded layer's gradients are reduced to their slices only after the backward
    # (our engine: worker/sharding.after_backward), so every holder holds them whole at the
    # step's peak at any sharding level; False: reduce-scattered during the backward (ZeRO-2).
    whole_gradients_at_peak: bool = False
    # Whether ``optimizer`` sharding (ZeRO-1) all-reduces whole gradients and then gathers the
    # updated slices (our engine: worker/sharding.py reduces slice by slice only at
    # ``gradients``), so its gather adds to plain data parallel's traffic; False: gradients
    # reduce-scattered and slices all-gathered (DeepSpeed's ZeRO-1), the all-reduce's volume.
    optimizer_sharding_all_reduces: bool = False
    # Whether plans of one-stage replicas all sharding ``gradients`` or ``full`` run layer by
    # layer (our engine: worker/layerwise.py; costmodel/sharding.runs_layer_by_layer): per-layer
    # gathers and reductions every microbatch, one layer whole at a time, in place of the
    # flags above.
    layerwise_sharded_replicas: bool = False

    def state_terms(self, model: ModelSpec, training: TrainingSpec) -> StateTerms:
        """Per-parameter bytes of weights, gradients, optimizer state and weight copies."""
        if self.fp32_training_state:
            adam = training.optimizer in (Optimizer.ADAM, Optimizer.ADAMW)
            sixteen_bit = training.runtime_precision is not Dtype.FP32
            return StateTerms(4.0, 4.0, 8.0 if adam else 4.0, 2.0 if sixteen_bit else 0.0)
        working = float(training.grad_bytes_per_param(model.dtype))
        return StateTerms(working, working, self.state_bytes(model, training) - 2 * working)

    def grad_bytes(self, model: ModelSpec, training: TrainingSpec) -> float:
        """Bytes per parameter the gradient all-reduce moves under this runtime."""
        if self.fp32_training_state:
            return 4.0  # the fp32 gradients themselves
        if self.allreduce_bytes_per_param is None:
            return float(training.grad_bytes_per_param(model.dtype))
        return self.allreduce_bytes_per_param

    def state_bytes(self, model: ModelSpec, training: TrainingSpec) -> float:
        """Training-state bytes per parameter under this runtime."""
        if self.fp32_training_state:
            return self.state_terms(model, training).state
        if self.state_bytes_per_param is None:
            return float(training.state_bytes_per_param(model.dtype))
        return self.state_bytes_per_param

    def framework_overhead_bytes(self, device: DeviceType) -> float:
        """Fixed bytes this runtime occupies on ``device`` before any model state."""
        if self.framework_bytes is None:
            return float(device.framework_overhead_bytes)
        return self.framework_bytes


ORCHESTRATOR = RuntimePreset(
    name="orchestrator",
    state_bytes_per_param=None,
    framework_bytes=None,
    # The engine starts each bucket's all-reduce from gradient hooks during the last backward.
    overlaps_gradient_allreduce=True,
    source="worker/engine.py keeps fp32 weights and gradients (+ optimizer state, + autocast "
    "copies under 16-bit), counted by worker/memory_account.py; footprint: the profiler's "
    "runtime section, else DeviceType.framework_overhead_bytes",
    fp32_training_state=True,
    measured_constants=True,
    # worker/engine_config.py EngineConfig.grad_bucket_mb = 25 (DDP's bucket_cap_mb), in MiB; a
    # model whose gradients fit one bucket gets no overlap at all.
    grad_bucket_bytes=25.0 * 1024 * 1024,
    # worker/sharding.py gathers a step's parameters once (layer-by-layer plans excepted:
    # layerwise_sharded_replicas)
    gathered_layers=None,
    blocks_sharded_reduction=True,
    whole_gradients_at_peak=True,
    optimizer_sharding_all_reduces=True,
    layerwise_sharded_replicas=True,
)

MEGATRON_DEEPSPEED = RuntimePreset(
    name="megatron-deepspeed",
    state_bytes_per_param=24.0,
    framework_bytes=4.0 * GiB,
    # DeepSpeed's PipelineEngine reduces gradients in a ReduceGrads step after the last microbatch.
    overlaps_gradient_allreduce=False,
    source="Megatron-LM/DeepSpeed buffers (see module docstring); footprint and overheads fitted "
    "on the validation runs",
    # Least squares on the validation runs' relative step-time residuals (11 consistent runs, mbs
    # 1 and 4, 1 to 128 microbatches): the residual grows by ~4.5 ms per microbatch and stage
    # whatever the microbatch size (so it is not bandwidth or FLOPs: DeepSpeed's PipelineEngine runs
    # each microbatch as interpreted instructions, each p2p with a blocking handshake), plus ~85 ms
    # per step (fp16 loss-scale overflow check, gradient-norm all-reduce, optimizer bookkeeping).
    microbatch_overhead_s=0.0045,
    step_overhead_s=0.085,
    # Megatron all-reduces its fp32 main_grad buffer (accumulate_allreduce_grads_in_fp32).
    allreduce_bytes_per_param=4.0,
)

PRESETS: dict[str, RuntimePreset] = {p.name: p for p in (ORCHESTRATOR, MEGATRON_DEEPSPEED)}


def runtime_preset(name: str) -> RuntimePreset:
    """The preset called ``name`` (``orchestrator`` or ``megatron-deepspeed``)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown runtime preset {name!r}; choose among {sorted(PRESETS)}"
        ) from None

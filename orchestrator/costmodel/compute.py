"""Analytic per-layer compute time, used where no measured profile exists.

FLOP counts follow the standard transformer arithmetic (Kaplan et al. 2020; Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters", appendix): a matmul of an
``[n, k] x [k, m]`` pair costs ``2 n k m`` FLOPs, backward costs twice forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.spec.devices import DeviceType, Dtype
from orchestrator.spec.model import LayerKind, ModelSpec, Optimizer, TrainingSpec

# Backward computes gradients for inputs and weights: two matmuls per forward matmul.
BACKWARD_TO_FORWARD_FLOPS = 2.0

# Achieved fraction of dense peak for transformer blocks.
# 16-bit (tensor cores): fitted to Sailor's measured A100-40 profiles (Megatron-DeepSpeed, fp16):
# OPT-350 (hidden 1024) reaches ~8% of peak per block at microbatch 1, GPT-Neo-2.7 (hidden 2560)
# ~23%. Small matmuls use the tensor cores poorly, so the fraction grows with hidden size up to a
# ceiling; 0.45 is Megatron's best reported MFU at scale.
FRACTION_OF_PEAK_AT_HIDDEN_2560 = 0.23
FRACTION_OF_PEAK_CEILING = 0.45
FRACTION_OF_PEAK_FLOOR = 0.05
# fp32 (no tensor cores): measured on an H200 with bench/gpu_check.py (bench/results/): a block of
# hidden 2048 reaches 43-50 TFLOP/s of the 67 peak, 64-74% at microbatch 1-8.
FP32_FRACTION_OF_PEAK_AT_HIDDEN_2048 = 0.65

# Kernel launch and framework overhead per layer and pass: ~20 CUDA kernels per block at
# ~5 us each (NVIDIA's launch latency figure) = 1e-4 s.
LAUNCH_OVERHEAD_S_PER_LAYER_PASS = 1e-4

# Bytes of memory traffic per parameter in one optimizer update (memory-bound elementwise work):
# mixed-precision Adam reads fp32 master, m, v and the 16-bit grad (14 B) and writes master, m, v
# and the 16-bit weight (14 B); SGD with momentum reads/writes weights and momentum (~16 B).
UPDATE_BYTES_PER_PARAM = {Optimizer.ADAM: 28, Optimizer.ADAMW: 28, Optimizer.SGD: 16}
# Per-layer optimizer steps over many small tensors reach a fraction of peak memory bandwidth:
# measured on an H200 (bench/gpu_check.py), Adam on a 50M-parameter fp32 block took 1.3-1.6 ms
# against 0.29 ms at the 4.8 TB/s peak, about 20%.
UPDATE_FRACTION_OF_MEMORY_BANDWIDTH = 0.2


def achieved_fraction_of_peak(hidden_size: int, dtype: Dtype = Dtype.BF16) -> float:
    """Fraction of dense peak FLOP/s a transformer layer of this width reaches (see above)."""
    if dtype is Dtype.FP32:
        scaled = FP32_FRACTION_OF_PEAK_AT_HIDDEN_2048 * hidden_size / 2048
        return min(FP32_FRACTION_OF_PEAK_AT_HIDDEN_2048, max(FRACTION_OF_PEAK_FLOOR, scaled))
    scaled = FRACTION_OF_PEAK_AT_HIDDEN_2560 * hidden_size / 2560
    return min(FRACTION_OF_PEAK_CEILING, max(FRACTION_OF_PEAK_FLOOR, scaled))


def forward_flops_per_sample(model: ModelSpec, layer: int) -> float:
    """Forward FLOPs of planner layer ``layer`` for one sample of ``sequence_length`` tokens."""
    s, h, v = model.sequence_length, model.hidden_size, model.vocab_size
    kind = model.layer_kind(layer)
    if kind is LayerKind.EMBEDDING:
        return 0.0  # a table lookup: memory-bound, costed by bytes below
    if kind is LayerKind.HEAD:
        return 2.0 * s * h * v  # output projection to the vocabulary
    # q, k, v, out projections and the MLP matrices (grouped-query and gated forms exactly)
    matmul_params = model.block_matmul_params
    attention = 4.0 * s * s * h  # QK^T and attention x V, 2 s^2 h each (query heads x head dim)
    return 2.0 * s * matmul_params + attention


@dataclass(frozen=True)
class LayerTime:
    """Seconds for one planner layer at one (microbatch size, tp) on one device."""

    forward_s: float
    backward_s: float
    update_s: float
    estimated: bool


def analytic_layer_time(
    model: ModelSpec,
    training: TrainingSpec,
    device: DeviceType,
    layer: int,
    microbatch_size: int,
    tp: int,
    tp_comm_s: float,
) -> LayerTime:
    """Estimate a layer's time from FLOPs and the device's datasheet peak.

    ``tp_comm_s`` is the tensor-parallel all-reduce time of one pass (0 when ``tp == 1``).
    """
    peak = device.flops_per_s(model.dtype) * achieved_fraction_of_peak(
        model.hidden_size, model.dtype
    )
    flops = forward_flops_per_sample(model, layer) * microbatch_size / tp
    forward_s = flops / peak + LAUNCH_OVERHEAD_S_PER_LAYER_PASS
    if model.layer_kind(layer) is LayerKind.EMBEDDING:
        # Gather microbatch x seq rows of the table and write them out.
        row_bytes = model.hidden_size * model.dtype.size_bytes
        moved = 2 * microbatch_size * model.sequence_length * row_bytes / tp
        forward_s = moved / device.memory_bandwidth_bytes_per_s + LAUNCH_OVERHEAD_S_PER_LAYER_PASS
    backward_s = BACKWARD_TO_FORWARD_FLOPS * (forward_s - LAUNCH_OVERHEAD_S_PER_LAYER_PASS)
    backward_s += LAUNCH_OVERHEAD_S_PER_LAYER_PASS
    update_bytes = model.layer_params(layer) / tp * UPDATE_BYTES_PER_PARAM[training.optimizer]
    update_s = update_bytes / (
        device.memory_bandwidth_bytes_per_s * UPDATE_FRACTION_OF_MEMORY_BANDWIDTH
    )
    return LayerTime(
        forward_s=forward_s + tp_comm_s,
        backward_s=backward_s + tp_comm_s,
        update_s=update_s,
        estimated=True,
    )

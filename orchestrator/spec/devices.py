"""Device types and the built-in catalog, from public datasheets.

Every figure is a *peak* from the vendor's datasheet (dense, no structured sparsity). The cost model
scales peaks by an achievable fraction (see ``costmodel.compute``); measured profiles replace both.
Memory is the marketed capacity in bytes (GB = 1e9 for HBM3e parts as NVIDIA states them, GiB for
the older parts whose "16 GB" is 16 GiB of DRAM).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

GiB = 1024**3
GB = 1000**3
TFLOPS = 1e12
GB_PER_S = 1e9


class Dtype(StrEnum):
    """Training number formats the cost model knows."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def size_bytes(self) -> int:
        return 4 if self is Dtype.FP32 else 2


class DeviceType(BaseModel):
    """One accelerator model: what it holds, how fast it computes and how fast it talks.

    ``peak_flops_per_s`` maps each dtype to dense peak FLOP/s as frameworks reach it (tensor cores
    where the part has them for that dtype; parts without bf16 support list their fp32 rate for
    bf16, because that is what a bf16 model runs at on them after the framework upcasts; the P40's
    fp16 likewise). ``planner/precision.py`` reads these rates to pick a job's precision.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    memory_bytes: PositiveInt
    peak_flops_per_s: dict[Dtype, PositiveFloat]
    memory_bandwidth_bytes_per_s: PositiveFloat
    intra_node_bandwidth_bytes_per_s: PositiveFloat
    # CUDA context, allocator fragmentation, NCCL buffers: ~1-2 GiB measured on A100/H100 with
    # PyTorch 2.x (torch.cuda.memory_reserved minus allocated after warm-up); smaller parts less.
    framework_overhead_bytes: int = Field(default=int(1.5 * GiB), ge=0)
    description: str = ""

    @model_validator(mode="after")
    def _complete_and_consistent(self) -> DeviceType:
        if Dtype.FP32 not in self.peak_flops_per_s:  # the rate that stands in for the others
            raise ValueError(
                "peak_flops_per_s lacks fp32; give at least the fp32 rate (fp16 and bf16 "
                "default to it)"
            )
        if self.framework_overhead_bytes >= self.memory_bytes:
            raise ValueError(
                f"framework_overhead_bytes ({self.framework_overhead_bytes}) is not below "
                f"memory_bytes ({self.memory_bytes}); nothing would be left for the model"
            )
        return self

    def flops_per_s(self, dtype: Dtype) -> float:
        """Peak dense FLOP/s for ``dtype``, falling back to fp32 where the part lists no rate."""
        return self.peak_flops_per_s.get(dtype, self.peak_flops_per_s[Dtype.FP32])

    @property
    def usable_memory_bytes(self) -> int:
        """Memory left for weights, gradients, optimizer state and activations."""
        return max(0, self.memory_bytes - self.framework_overhead_bytes)


def _device(
    name: str,
    memory_bytes: float,
    fp32_tflops: float,
    fp16_tflops: float,
    bf16_tflops: float,
    memory_bandwidth_gb_per_s: float,
    intra_node_gb_per_s: float,
    description: str,
    framework_overhead_bytes: float = 1.5 * GiB,
) -> DeviceType:
    return DeviceType(
        name=name,
        memory_bytes=int(memory_bytes),
        peak_flops_per_s={
            Dtype.FP32: fp32_tflops * TFLOPS,
            Dtype.FP16: fp16_tflops * TFLOPS,
            Dtype.BF16: bf16_tflops * TFLOPS,
        },
        memory_bandwidth_bytes_per_s=memory_bandwidth_gb_per_s * GB_PER_S,
        intra_node_bandwidth_bytes_per_s=intra_node_gb_per_s * GB_PER_S,
        framework_overhead_bytes=int(framework_overhead_bytes),
        description=description,
    )


# fp32 column: non-tensor FP32 (TF32 is not used for the fp32 figure: it changes numerics).
# Intra-node bandwidth: per-GPU unidirectional NVLink where the SXM/HGX board has it, else PCIe
# (Gen4 x16 = 32 GB/s, Gen3 x16 = 16 GB/s per direction).
BUILTIN_DEVICE_TYPES: tuple[DeviceType, ...] = (
    # NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, BF16/FP16 989 TFLOPS dense, FP32 67,
    # NVLink 900 GB/s.
    _device("H200", 141 * GB, 67, 989, 989, 4800, 450, "NVIDIA H200 SXM 141 GB"),
    # NVIDIA H100 SXM5 datasheet: 80 GB HBM3, 3.35 TB/s, BF16 989 TFLOPS dense, FP32 67, NVLink 900.
    _device("H100", 80 * GB, 67, 989, 989, 3350, 450, "NVIDIA H100 SXM5 80 GB"),
    # NVIDIA GH200 Grace Hopper datasheet (96 GB HBM3 variant): 4 TB/s, BF16 989 TFLOPS dense.
    _device("GH-96", 96 * GB, 67, 989, 989, 4000, 450, "NVIDIA GH200 96 GB (Hopper GPU)"),
    # NVIDIA A100 datasheet: 312 TFLOPS BF16/FP16 dense, 19.5 FP32, NVLink 600 GB/s (bidirectional).
    _device("A100-80", 80 * GB, 19.5, 312, 312, 2039, 300, "NVIDIA A100 SXM4 80 GB"),
    _device("A100-40", 40 * GB, 19.5, 312, 312, 1555, 300, "NVIDIA A100 SXM4 40 GB"),
    # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, BF16 362 TFLOPS dense, FP32 91.6, PCIe Gen4.
    _device("L40S", 48 * GB, 91.6, 362, 362, 864, 32, "NVIDIA L40S 48 GB"),
    # NVIDIA A10 datasheet (AWS A10G is a variant): 24 GB, 600 GB/s, BF16 125 dense, FP32 31.2.
    _device("A10G", 24 * GB, 31.2, 125, 125, 600, 32, "NVIDIA A10G 24 GB"),
    # NVIDIA RTX A6000 datasheet: 48 GB, 768 GB/s, tensor 154.8 TFLOPS dense, FP32 38.7.
    _device("A6000", 48 * GB, 38.7, 154.8, 154.8, 768, 32, "NVIDIA RTX A6000 48 GB"),
    # NVIDIA L4 datasheet: 24 GB, 300 GB/s, BF16 121 TFLOPS dense, FP32 30.3, PCIe Gen4.
    _device("L4", 24 * GB, 30.3, 121, 121, 300, 32, "NVIDIA L4 24 GB", 1.0 * GiB),
    # NVIDIA T4 datasheet: 16 GB, 320 GB/s, FP16 tensor 65 TFLOPS, FP32 8.1, no BF16, PCIe Gen3.
    _device("T4", 16 * GiB, 8.1, 65, 8.1, 320, 16, "NVIDIA T4 16 GB", 1.0 * GiB),
    # NVIDIA V100 SXM2 datasheet: FP16 tensor 125 TFLOPS, FP32 15.7, 900 GB/s, NVLink 300 GB/s.
    _device("V100-32", 32 * GiB, 15.7, 125, 15.7, 900, 150, "NVIDIA V100 SXM2 32 GB"),
    _device("V100-16", 16 * GiB, 15.7, 125, 15.7, 900, 150, "NVIDIA V100 SXM2 16 GB", 1.0 * GiB),
    # GeForce RTX 3090 (GA102 whitepaper): FP16 tensor with FP32 accumulate 71 TFLOPS, FP32 35.6.
    _device("RTX-3090", 24 * GiB, 35.6, 71, 71, 936, 32, "NVIDIA GeForce RTX 3090 24 GB", GiB),
    # GeForce RTX 2080 (Turing whitepaper): FP16 tensor with FP32 accumulate 20.1, FP32 10.1.
    _device(
        "RTX-2080", 8 * GiB, 10.1, 20.1, 10.1, 448, 16, "NVIDIA GeForce RTX 2080 8 GB", 0.75 * GiB
    ),
    # Titan RTX (Turing whitepaper): FP16 tensor 130 TFLOPS, FP32 16.3, 672 GB/s.
    _device("Titan-RTX", 24 * GiB, 16.3, 130, 16.3, 672, 16, "NVIDIA Titan RTX 24 GB", GiB),
    # Tesla P40 datasheet: FP32 11.8 TFLOPS, 346 GB/s, PCIe Gen3. Its native FP16 arithmetic runs
    # at 1/64 rate (0.18), but that is not what a framework gets: PyTorch's fp16 matmuls on this
    # part (sm_61) go through cuBLAS with fp32 compute (CUBLAS_COMPUTE_32F, fp16 storage), so they
    # run at about the fp32 rate; the rate listed is that one (no tensor cores: not "fast" fp16).
    _device("P40", 24 * GiB, 11.8, 11.8, 11.8, 346, 16, "NVIDIA Tesla P40 24 GB", GiB),
    # A CPU "device" for emulated clusters and tests: ~0.1 TFLOPS fp32 for a few AVX2 cores
    # (measured order of magnitude for torch matmul on 2 cores), shared-memory transfers ~10 GB/s.
    _device("cpu", 16 * GiB, 0.1, 0.05, 0.05, 20, 10, "host CPU (emulation base)", 0.25 * GiB),
)


# Ray's accelerator-type names (ray.util.accelerators) that differ from catalog names. Where Ray
# does not say which memory size, take the smaller part: a plan that fits it fits the larger.
DEVICE_ALIASES: dict[str, str] = {
    "A100": "A100-40",
    "A100-40G": "A100-40",
    "A100-80G": "A100-80",
    "V100": "V100-16",
    "A10": "A10G",
}


class DeviceCatalog:
    """Name -> DeviceType lookup with the built-in entries, optionally overridden or extended."""

    def __init__(self, device_types: tuple[DeviceType, ...] | list[DeviceType]) -> None:
        self._by_name: dict[str, DeviceType] = {d.name: d for d in device_types}

    @classmethod
    def builtin(cls, extra: list[DeviceType] | tuple[DeviceType, ...] = ()) -> DeviceCatalog:
        """The built-in catalog, with ``extra`` entries defining new types or replacing old ones."""
        return cls([*BUILTIN_DEVICE_TYPES, *extra])

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> DeviceType:
        return self._by_name[name]

    def resolve(self, name: str) -> str | None:
        """The catalog name for ``name`` (a catalog name or an alias), or ``None``."""
        resolved = DEVICE_ALIASES.get(name, name)
        return resolved if resolved in self._by_name else None

    def names(self) -> list[str]:
        """Names in catalog order."""
        return list(self._by_name)

    def all(self) -> list[DeviceType]:
        """Entries in catalog order."""
        return list(self._by_name.values())

"""Which precision every device of a plan runs well, and why.

A 16-bit format is *fast* on a device type when the catalog's rate for it (what frameworks achieve:
see the catalog's sources in ``spec/devices.py``) is at least twice its fp32 rate, i.e. it runs on
tensor cores. T4, V100 and the Turing parts have fast fp16 but no bf16 (PyTorch runs bf16 matmuls
there at the fp32 rate or below); the P40 has neither (its fp16 runs at about its fp32 rate in
PyTorch). A plan in a format that some of its devices do not run fast is estimated, and runs, at
their fp32 rate on those devices while its memory is planned for 16 bits: the choice below avoids
that by taking the format every planned type runs fast, bf16 first (no loss scaling needed), then
fp16 (dynamic loss scaling), else fp32.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.spec.devices import DeviceType, Dtype

# A 16-bit rate at least this many times the fp32 rate means tensor cores for that format.
FAST_OVER_FP32 = 2.0


def fast_formats(device: DeviceType) -> frozenset[Dtype]:
    """The 16-bit formats ``device`` runs on tensor cores (fp32 always runs; never listed)."""
    fp32 = device.flops_per_s(Dtype.FP32)
    return frozenset(
        d for d in (Dtype.BF16, Dtype.FP16) if device.flops_per_s(d) >= FAST_OVER_FP32 * fp32
    )


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision for a set of device types, and a one-line reason."""

    precision: Dtype
    reason: str


def choose_precision(devices: Iterable[DeviceType]) -> PrecisionChoice:
    """bf16 if every type runs it fast, else fp16 if every type does, else fp32."""
    types = sorted({d.name: d for d in devices}.values(), key=lambda d: d.name)
    no_bf16 = [d.name for d in types if Dtype.BF16 not in fast_formats(d)]
    no_fp16 = [d.name for d in types if Dtype.FP16 not in fast_formats(d)]
    if not no_bf16:
        return PrecisionChoice(Dtype.BF16, "every planned device type runs bf16 on tensor cores")
    if not no_fp16:
        return PrecisionChoice(
            Dtype.FP16,
            f"{', '.join(no_bf16)} have no fast bf16; every planned type runs fp16 on tensor "
            "cores (with dynamic loss scaling)",
        )
    return PrecisionChoice(
        Dtype.FP32,
        f"{', '.join(sorted(set(no_bf16) & set(no_fp16)))} run neither bf16 nor fp16 faster "
        "than fp32",
    )


def precision_note(requested: Dtype, devices: Iterable[DeviceType]) -> str | None:
    """A warning when ``requested`` is slow on some of ``devices`` (None when all run it well),
    naming the precision :func:`choose_precision` would take instead."""
    if requested is Dtype.FP32:
        return None
    types = sorted({d.name: d for d in devices}.values(), key=lambda d: d.name)
    slow = [d.name for d in types if requested not in fast_formats(d)]
    if not slow:
        return None
    better = choose_precision(types)
    return (
        f"{requested} is not fast on {', '.join(slow)} (they run it at about their fp32 rate); "
        f"{better.precision} suits every planned type: {better.reason}"
    )


def precision_summary(planned: Dtype, devices: Iterable[DeviceType]) -> dict[str, str | None]:
    """What the plan output says: the precision planned, the one every planned type runs well
    and why, and a warning when the two differ in speed (see :func:`precision_note`)."""
    types = list(devices)
    choice = choose_precision(types)
    return {
        "planned": planned.value,
        "suits_every_type": choice.precision.value,
        "reason": choice.reason,
        "warning": precision_note(planned, types),
    }

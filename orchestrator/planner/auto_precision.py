"""``training.precision: auto``: plan in each format on the devices that run it fast, keep the
fastest, and say which and why.

The candidates are bf16 and fp16, each on the device types that run it on tensor cores
(:func:`~orchestrator.planner.precision.fast_formats`; the others are left out of that plan), and
fp32 on every device. Each is planned and costed in its own format (memory of 16-bit or fp32
working tensors, the catalog's peak for that format, the profiles measured in it). The fastest
estimate wins; on equal step times bf16 before fp16 (no loss scaling) before fp32. So a cluster
whose types all run bf16 fast trains in bf16; one with T4s or V100s in fp16, unless leaving them
out in bf16 is faster (it never is at equal rates); one with P40s in fp32 on every device, unless
leaving the P40s out in 16 bits is faster. The chosen plan records its format (``Plan.precision``)
and the runtime runs exactly it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from orchestrator.errors import InfeasibleError
from orchestrator.planner.precision import choose_precision, fast_formats
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.devices import DeviceType, Dtype
from orchestrator.spec.model import AUTO_PRECISION, TrainingSpec
from orchestrator.spec.plan import Plan

R = TypeVar("R")  # the search's result at one precision

# Preference on equal step times: bf16 needs no loss scaling; fp16 does; fp32 is the slowest.
ORDER = (Dtype.BF16, Dtype.FP16, Dtype.FP32)


@dataclass(frozen=True)
class PrecisionCandidate:
    """One format's best plan: its step time (None: nothing fits) and the types left out."""

    precision: Dtype
    excluded: tuple[str, ...]
    step_time_s: float | None
    note: str = ""


@dataclass(frozen=True)
class PrecisionDecision:
    """The format ``auto`` chose, the device types it left out, and why."""

    precision: Dtype
    excluded: tuple[str, ...]
    reason: str
    candidates: tuple[PrecisionCandidate, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "chosen": self.precision.value,
            "excluded_device_types": list(self.excluded),
            "reason": self.reason,
            "candidates": {
                c.precision.value: {
                    "step_time_s": c.step_time_s,
                    "excluded_device_types": list(c.excluded),
                    "note": c.note,
                }
                for c in self.candidates
            },
        }


def _types_running(cluster: Cluster, precision: Dtype) -> tuple[list[str], list[str]]:
    """(types that run ``precision`` well, types that do not), sorted by name."""
    types = cluster.device_types
    if precision is Dtype.FP32:
        return sorted(types), []
    keep = sorted(n for n, d in types.items() if precision in fast_formats(d))
    return keep, sorted(n for n in types if n not in keep)


def _restricted(cluster: Cluster, keep: list[str]) -> Cluster:
    return Cluster(nodes=tuple(n for n in cluster.nodes if n.device_type.name in keep))


def _reason(chosen: PrecisionCandidate, others: list[PrecisionCandidate]) -> str:
    where = (
        f"leaving out {', '.join(chosen.excluded)} (no fast {chosen.precision})"
        if chosen.excluded
        else "on every device type, all of which run it "
        + ("fast" if chosen.precision is not Dtype.FP32 else "(no format is faster on all)")
    )
    parts = [f"{chosen.precision} {where}"]
    assert chosen.step_time_s is not None
    for c in others:
        if c.step_time_s is None:
            parts.append(f"{c.precision}: {c.note}")
        elif c.step_time_s == chosen.step_time_s:
            parts.append(f"{c.precision} as fast (preferring {chosen.precision})")
        else:
            ratio = c.step_time_s / chosen.step_time_s
            parts.append(f"{ratio:.2f}x the step time in {c.precision}")
    return "; ".join(parts)


def plan_auto(
    cluster: Cluster,
    training: TrainingSpec,
    plan_one: Callable[[Cluster, TrainingSpec], R],
    step_time_s: Callable[[R], float],
) -> tuple[PrecisionDecision, dict[Dtype, R]]:
    """Plan once per format with ``plan_one`` (the search at a fixed precision, on the device
    types that run it fast) and choose the fastest (module docstring): the decision, and each
    feasible format's result. Taking the search as an argument keeps this module below it.

    Raises :class:`~orchestrator.errors.InfeasibleError` when no format fits (the fp32 search's
    message: it plans on every device).
    """
    results: dict[Dtype, R] = {}
    candidates: list[PrecisionCandidate] = []
    fp32_error: InfeasibleError | None = None
    for precision in ORDER:
        keep, left_out = _types_running(cluster, precision)
        if not keep:
            candidates.append(
                PrecisionCandidate(precision, tuple(left_out), None, "no device type runs it fast")
            )
            continue
        fixed = training.model_copy(update={"precision": precision})
        try:
            result = plan_one(_restricted(cluster, keep), fixed)
        except InfeasibleError as exc:
            if precision is Dtype.FP32:
                fp32_error = exc
            where = f" without {', '.join(left_out)}" if left_out else ""
            candidates.append(
                PrecisionCandidate(precision, tuple(left_out), None, f"nothing fits{where}")
            )
            continue
        results[precision] = result
        candidates.append(PrecisionCandidate(precision, tuple(left_out), step_time_s(result)))
    feasible = [c for c in candidates if c.step_time_s is not None]
    if not feasible:
        assert fp32_error is not None
        raise fp32_error
    best = min(feasible, key=lambda c: (c.step_time_s, ORDER.index(c.precision)))
    decision = PrecisionDecision(
        precision=best.precision,
        excluded=best.excluded,
        reason=_reason(best, [c for c in candidates if c is not best]),
        candidates=tuple(candidates),
    )
    return decision, results


def with_auto_precision(
    plan: Plan, training: TrainingSpec, device_types: Mapping[str, DeviceType]
) -> Plan:
    """``plan`` with a precision recorded when ``training.precision`` is ``auto`` and the plan
    (hand-written, or from before plans recorded one) has none: the format every device type the
    plan uses runs fast (:func:`~orchestrator.planner.precision.choose_precision`; its layout is
    given, so no type is left out). Unchanged otherwise, or when a type is not in
    ``device_types``."""
    if training.precision != AUTO_PRECISION or plan.precision is not None:
        return plan
    names = sorted(plan.device_counts())
    if any(n not in device_types for n in names):
        return plan
    chosen = choose_precision([device_types[n] for n in names]).precision
    return plan.model_copy(update={"precision": chosen})

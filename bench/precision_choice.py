"""What ``training.precision: auto`` picks on mixed clusters, and what it gains, by the cost model.

For each cluster: the predicted step time of the best plan in bf16 and in fp16 (each on the
device types that run that format fast; the others left out) and in fp32 (every device), the
format ``auto`` takes, the types it leaves out, and its gain over the plan a job pinned to bf16
would get on the whole cluster (slow types included, run at their fp32 rate) and over fp32.
Catalog rates, no profiles: layer times are FLOP estimates (docs/planner.md), so these are the
planner's figures, not measurements. Baselines are planned in the same run.

Run: .venv/bin/python bench/precision_choice.py
"""

from __future__ import annotations

import time

from orchestrator.errors import InfeasibleError
from orchestrator.planner import make_plan
from orchestrator.spec.cluster import ClusterSpec
from orchestrator.spec.model import ModelSpec, TrainingSpec

MODEL = ModelSpec(
    name="gpt-1.3b",
    num_layers=24,
    hidden_size=2048,
    num_heads=16,
    sequence_length=2048,
    vocab_size=50304,
    dtype="bf16",
)
CLUSTERS = {
    "8 A100-80 + 8 H100": [("A100-80", 1, 8), ("H100", 1, 8)],
    "8 A100-80 + 16 V100-32": [("A100-80", 1, 8), ("V100-32", 2, 8)],
    "16 V100-32 + 16 T4": [("V100-32", 2, 8), ("T4", 4, 4)],
    "4 A100-80 + 32 P40": [("A100-80", 1, 4), ("P40", 4, 8)],
    "8 T4 + 16 P40": [("T4", 2, 4), ("P40", 2, 8)],
}


def _cluster(groups: list[tuple[str, int, int]]):  # type: ignore[no-untyped-def]
    return ClusterSpec.model_validate(
        {
            "node_groups": [
                {"name": f"g{i}", "device_type": t, "num_nodes": n, "devices_per_node": d}
                for i, (t, n, d) in enumerate(groups)
            ]
        }
    ).resolve()


def _step(cluster, precision: str) -> float | None:  # type: ignore[no-untyped-def]
    training = TrainingSpec(global_batch_size=256, precision=precision)
    try:
        return make_plan(cluster, MODEL, training).estimate.step_time_s
    except InfeasibleError:
        return None


def main() -> None:
    print(
        f"{'cluster':<24} {'bf16 s':>7} {'fp16 s':>7} {'fp32 s':>7}  {'auto':<5}"
        f" {'left out':<9} {'vs bf16 on all':>14} {'vs fp32':>8} {'search s':>8}"
    )
    for name, groups in CLUSTERS.items():
        cluster = _cluster(groups)
        started = time.perf_counter()
        result = make_plan(cluster, MODEL, TrainingSpec(global_batch_size=256, precision="auto"))
        searched_s = time.perf_counter() - started
        decision = result.precision_choice
        assert decision is not None
        by = {c.precision.value: c.step_time_s for c in decision.candidates}
        chosen_s = result.estimate.step_time_s
        pinned_bf16 = _step(cluster, "bf16")  # whole cluster, slow types at their fp32 rate
        cells = " ".join(f"{by[p]:7.3f}" if by[p] is not None else f"{'-':>7}" for p in by)
        vs_pinned = f"{pinned_bf16 / chosen_s:13.2f}x" if pinned_bf16 else f"{'-':>14}"
        vs_fp32 = f"{by['fp32'] / chosen_s:7.2f}x" if by["fp32"] else f"{'-':>8}"
        print(
            f"{name:<24} {cells}  {decision.precision.value:<5}"
            f" {','.join(decision.excluded) or '-':<9} {vs_pinned} {vs_fp32} {searched_s:8.2f}"
        )
        print(f"  why: {decision.reason}")


if __name__ == "__main__":
    main()

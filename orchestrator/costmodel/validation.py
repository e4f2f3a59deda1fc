"""Measured training runs, and the cost model's predictions for them.

A validation file (``orchestrator-validation/v1``) lists real runs: the plan (stages with their
layer ranges, tensor-parallel degree and data-parallel degree), the nodes it ran on, and what was
measured (seconds per step, peak device memory). :func:`predict_runs` builds each run's plan and
cluster and asks :func:`~orchestrator.costmodel.estimate.estimate_with_tables` for it, so the
benchmark (``bench/costmodel_accuracy.py``) and the accuracy test compare the same numbers.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.costmodel.estimate import Estimate, estimate_with_tables
from orchestrator.costmodel.presets import RuntimePreset, runtime_preset
from orchestrator.costmodel.tables import CostTables
from orchestrator.spec.cluster import Cluster, Node
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, ReplicaSpec, StageSpec
from orchestrator.spec.profiles import ProfileSet

VALIDATION_FORMAT = "orchestrator-validation/v1"

# Alps/Clariden GH200 nodes: four GH200 modules, each with its own HPE Slingshot-11 NIC
# (200 Gb/s = 25 GB/s per direction), so 100 GB/s per node (CSCS Alps documentation).
NODE_NETWORK_BYTES_PER_S = {"GH-96": 100e9}


@dataclass(frozen=True)
class Run:
    """One measured run as the validation file gives it."""

    name: str
    device_type: str
    gpus_per_node: int
    nodes: int
    microbatch_size: int
    global_batch_size: int
    stages: tuple[tuple[int, int, int, int], ...]  # (first layer, end layer, tp, dp)
    measured_step_s: float
    measured_peak_memory_bytes: float


@dataclass(frozen=True)
class Prediction:
    run: Run
    estimate: Estimate

    @property
    def step_error(self) -> float:
        """Relative error of the predicted step time (signed: > 0 predicts too slow)."""
        return self.estimate.step_time_s / self.run.measured_step_s - 1.0

    @property
    def memory_error(self) -> float:
        return self.estimate.peak_memory_bytes / self.run.measured_peak_memory_bytes - 1.0

    @property
    def largest_term(self) -> tuple[str, float]:
        """The biggest of the step's terms: pipeline compute and p2p, exposed all-reduce, update."""
        e = self.estimate
        terms = {"pipeline": e.pipeline_s, "allreduce": e.allreduce_s, "update": e.update_s}
        name = max(terms, key=lambda k: terms[k])
        return name, terms[name]


def load_runs(path: Path) -> tuple[dict[str, Any], list[Run]]:
    """The file's header and its runs."""
    doc = json.loads(path.read_text())
    if doc.get("format") != VALIDATION_FORMAT:
        raise ValueError(f"{path}: format must be {VALIDATION_FORMAT}")
    runs = [
        Run(
            name=r["name"],
            device_type=r["device_type"],
            gpus_per_node=r["gpus_per_node"],
            nodes=r["nodes"],
            microbatch_size=r["microbatch_size"],
            global_batch_size=r["global_batch_size"],
            stages=tuple((s["layers"][0], s["layers"][1], s["tp"], s["dp"]) for s in r["stages"]),
            measured_step_s=r["measured_step_s"],
            measured_peak_memory_bytes=r["measured_peak_memory_bytes"],
        )
        for r in doc["runs"]
    ]
    return doc, runs


def run_cluster(run: Run, catalog: DeviceCatalog | None = None) -> Cluster:
    device = (catalog or DeviceCatalog.builtin())[run.device_type]
    network = NODE_NETWORK_BYTES_PER_S.get(run.device_type, 100e9)
    return Cluster(
        nodes=tuple(
            Node(
                name=f"n{i}",
                group=run.device_type,
                device_type=device,
                num_devices=run.gpus_per_node,
                intra_node_bandwidth_bytes_per_s=device.intra_node_bandwidth_bytes_per_s,
                inter_node_bandwidth_bytes_per_s=network,
            )
            for i in range(run.nodes)
        )
    )


def run_plan(run: Run) -> Plan:
    """The run's plan: ``dp`` replicas, each stage of a replica on its own node's devices.

    Devices are laid out as Megatron does: tp ranks of a stage on one node, consecutive stages of a
    replica on consecutive node slots.
    """
    dp = run.stages[0][3]
    if any(s[3] != dp for s in run.stages):
        raise ValueError(f"{run.name}: stages with different data-parallel degrees")
    slot = 0
    replicas = []
    share = run.global_batch_size // dp
    for _ in range(dp):
        stages = []
        for start, end, tp, _dp in run.stages:
            node = slot // run.gpus_per_node
            stages.append(
                StageSpec(layers=(start, end), device_type=run.device_type, tp=tp, node=f"n{node}")
            )
            slot += tp
        replicas.append(ReplicaSpec(batch_size=share, stages=tuple(stages)))
    return Plan(
        global_batch_size=run.global_batch_size,
        microbatch_size=run.microbatch_size,
        replicas=tuple(replicas),
    )


def predict_runs(
    runs: list[Run],
    model: ModelSpec,
    profiles: ProfileSet | None,
    runtime: str | RuntimePreset,
) -> list[Prediction]:
    """The cost model's estimate of every run under ``runtime`` (a preset or its name)."""
    preset = runtime_preset(runtime) if isinstance(runtime, str) else runtime
    out = []
    for run in runs:
        training = TrainingSpec(
            global_batch_size=run.global_batch_size,
            microbatch_sizes=[run.microbatch_size],
            max_tensor_parallel=max(s[2] for s in run.stages),
        )
        cluster = run_cluster(run)
        tables = CostTables.for_cluster(model, training, cluster, profiles, runtime=preset)
        out.append(Prediction(run, estimate_with_tables(run_plan(run), cluster, tables)))
    return out


def microbatch_stage_count(run: Run) -> int:
    """``m - 1 + p``: how many times a per-microbatch stage overhead enters the pipeline time."""
    dp = run.stages[0][3]
    micro = -(-run.global_batch_size // dp // run.microbatch_size)
    return micro - 1 + len(run.stages)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by linear interpolation (numpy's default)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def error_summary(errors: list[float]) -> tuple[float, float]:
    """Median and p90 of the absolute relative errors."""
    absolute = [abs(e) for e in errors]
    return statistics.median(absolute), percentile(absolute, 0.9)

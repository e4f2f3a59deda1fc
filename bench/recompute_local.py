"""fp32 vs bf16 vs bf16 + activation recompute on CPU processes: step time, and the activation
memory each rank holds at its 1F1B peak, measured against the cost model.

One replica of two stages (1F1B, 4 microbatches) of a small GPT. Step time: one local gloo
process per rank (``run_local``), real CPU speed, median of the slowest rank after one warm-up
step; baseline fp32 in the same run. Memory per rank: the stage's layers in this process, under
the precision's autocast (and recompute where the variant has it), forward ``p - s``
microbatches (stage ``s``'s 1F1B peak) and count the bytes autograd keeps for their backwards
(``saved_tensors_hooks``, each storage once, parameters left out); the prediction is the cost
model's ``in_flight x activation bytes`` of the same stage (``estimate_plan``; the recompute
transient, one block's full activations while it is recomputed, is reported beside it and not
measured here). CPU timings say what recompute costs in compute, not GPU speed
(``bench/gpu_check.py`` measures that).

Run: python bench/recompute_local.py [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from orchestrator.costmodel import CostTables
from orchestrator.models.gpt import make_gpt
from orchestrator.spec import ClusterSpec, ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan
from orchestrator.worker import recompute
from orchestrator.worker.data import DataConfig
from orchestrator.worker.engine import EngineConfig
from orchestrator.worker.layers import build_layers
from orchestrator.worker.local import run_local
from orchestrator.worker.precision import PrecisionPolicy, parse_precision

MODEL = {"num_layers": 4, "hidden_size": 128, "num_heads": 4, "sequence_length": 64}
VARIANTS = (("fp32", False), ("bf16", False), ("bf16", True))
MICROBATCH, BATCH = 4, 16
MiB = 2**20


def _plan(recomputed: bool) -> Plan:
    stages = [
        {"layers": [0, 3], "device_type": "cpu", "recompute": recomputed},
        {"layers": [3, 6], "device_type": "cpu", "recompute": recomputed},
    ]
    return Plan.model_validate(
        {
            "global_batch_size": BATCH,
            "microbatch_size": MICROBATCH,
            "replicas": [{"batch_size": BATCH, "stages": stages}],
        }
    )


def _step_s(plan: Plan, precision: str, steps: int) -> tuple[float, float]:
    config = EngineConfig(
        model_factory="orchestrator.models.gpt:make_gpt",
        model_kwargs=dict(MODEL),
        plan=plan,
        rank=0,
        data=DataConfig(sequence_length=MODEL["sequence_length"]),
        precision=precision,
    )
    run = run_local(config, range(steps), timeout_s=600)
    per_step = [max(r[s].step_s for r in run.results.values()) for s in range(steps)]
    last_loss = sum(r[-1].loss for r in run.results.values() if r[-1].loss is not None)
    return statistics.median(per_step[1:]), last_loss


def _held_bytes(plan: Plan, precision: str, stage: int) -> int:
    """Bytes autograd keeps for stage ``stage``'s microbatches in flight at its 1F1B peak."""
    gpt = make_gpt(**MODEL)
    spec = plan.replicas[0].stages[stage]
    indices = range(*spec.layers)
    layers = build_layers(gpt, indices, 0, torch.device("cpu"))
    modules = recompute.stage_layers(
        [layers[i] for i in indices], indices, gpt.num_planner_layers, spec.recompute
    )
    params = {p.untyped_storage().data_ptr() for m in layers.values() for p in m.parameters()}
    kept: dict[int, int] = {}
    alive: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
            alive.append(t)
        return t

    in_flight = len(plan.replicas[0].stages) - stage
    policy = PrecisionPolicy(parse_precision(precision), "cpu")
    outputs = []
    with policy.autocast(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for _ in range(in_flight):
            if stage == 0:
                x: torch.Tensor = torch.randint(0, 256, (MICROBATCH, MODEL["sequence_length"]))
            else:
                shape = gpt.boundary_shape(MICROBATCH)
                x = torch.randn(shape, dtype=policy.boundary_dtype(torch.float32))
                x.requires_grad_(True)
            for module in modules:
                x = module(x)
            outputs.append(x)
    return sum(kept.values())


def _predicted(plan: Plan, precision: str) -> list[tuple[float, float]]:
    """Per stage: (in-flight activation bytes, recompute transient bytes) the cost model says."""
    gpt = make_gpt(**MODEL)
    model = ModelSpec.model_validate({**gpt.spec.model_dump(), "dtype": precision})
    training = TrainingSpec(
        global_batch_size=BATCH, microbatch_sizes=[MICROBATCH], precision=precision
    )
    cluster = ClusterSpec(
        node_groups=[{"name": "n", "device_type": "cpu", "num_nodes": 1, "devices_per_node": 2}]
    ).resolve()
    tables = CostTables.for_cluster(model, training, cluster)
    out = []
    stages = plan.replicas[0].stages
    for s, spec in enumerate(stages):
        table = tables.table("cpu", MICROBATCH, 1, spec.recompute)
        in_flight = len(stages) - s
        out.append(
            (
                in_flight * table.activation_bytes(*spec.layers),
                table.transient_max_bytes(*spec.layers),
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for precision, recomputed in VARIANTS:
        plan = _plan(recomputed)
        step_s, loss = _step_s(plan, precision, args.steps)
        predicted = _predicted(plan, precision)
        for stage in range(len(plan.replicas[0].stages)):
            held = _held_bytes(plan, precision, stage)
            rows.append(
                {
                    "precision": precision,
                    "recompute": recomputed,
                    "step_s": step_s,
                    "last_loss": loss,
                    "rank": stage,
                    "held_bytes_measured": held,
                    "held_bytes_predicted": predicted[stage][0],
                    "transient_bytes_predicted": predicted[stage][1],
                }
            )
    base = rows[0]["step_s"]
    print(
        "variant              step s  vs fp32  last loss  rank  held MiB meas  pred  pred/meas"
        "  transient MiB pred"
    )
    for r in rows:
        name = f"{r['precision']}{' + recompute' if r['recompute'] else ''}"
        print(
            f"{name:>18}  {r['step_s']:7.3f}  {r['step_s'] / base:7.2f}  {r['last_loss']:9.6f}"
            f"  {r['rank']:4d}  {r['held_bytes_measured'] / MiB:13.2f}"
            f"  {r['held_bytes_predicted'] / MiB:5.2f}"
            f"  {r['held_bytes_predicted'] / r['held_bytes_measured']:9.2f}"
            f"  {r['transient_bytes_predicted'] / MiB:18.2f}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

"""Counted memory per rank against the cost model's per-rank terms, fp32 and bf16 plans.

The model is profiled on this machine by the profiler (``orchestrator profile``'s machinery), the
cost model predicts each rank's weights, gradients, optimizer state, 16-bit weight copies and
activations in flight from that profile, and the ranks (gloo processes on the CPU, no Ray) count
the same terms while training (``worker/memory_account.py``). Prints per rank and term: counted,
predicted, predicted / counted. Nothing passes or fails; the figures go to docs/benchmarks.md.

Run: .venv/bin/python bench/memory_account.py [--blocks 4] [--hidden 64] [--steps 2]
"""

from __future__ import annotations

import argparse
import os

import torch

from orchestrator.costmodel import CostTables
from orchestrator.costmodel.memory_terms import memory_terms
from orchestrator.spec.cluster import Cluster, Node
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan
from orchestrator.spec.profiles import ProfileSet
from orchestrator.worker import topology
from orchestrator.worker.data import DataConfig
from orchestrator.worker.engine import EngineConfig
from orchestrator.worker.local import run_local
from orchestrator.worker.profiler import ProfileRequest, profile

FACTORY = "orchestrator.models.gpt:make_gpt"
DEVICE = "A100-80"
MICROBATCH = 4


def bench_plan(num_layers: int, recompute: bool = False) -> Plan:
    """A whole-model replica and a two-stage pipeline, four microbatches each (1F1B: the
    pipeline's first stage holds two in flight); ``recompute``: on every stage."""
    half = num_layers // 2
    on = {"recompute": True} if recompute else {}
    return Plan.model_validate(
        {
            "global_batch_size": 32,
            "microbatch_size": MICROBATCH,
            "replicas": [
                {
                    "batch_size": 16,
                    "stages": [{"layers": [0, num_layers], "device_type": DEVICE, **on}],
                },
                {
                    "batch_size": 16,
                    "stages": [
                        {"layers": [0, half], "device_type": DEVICE, **on},
                        {"layers": [half, num_layers], "device_type": DEVICE, **on},
                    ],
                },
            ],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--sequence", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    shape = {
        "num_layers": args.blocks,
        "hidden_size": args.hidden,
        "num_heads": 4,
        "sequence_length": args.sequence,
    }
    data = DataConfig(sequence_length=args.sequence)
    plan = bench_plan(args.blocks + 2)
    recomputed = bench_plan(args.blocks + 2, recompute=True)
    measured = profile(ProfileRequest(FACTORY, dict(shape), DEVICE, (MICROBATCH,), data))
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"profiled runtime constants: {measured.runtime}")
    model = ModelSpec(name=measured.model, vocab_size=256, dtype="fp32", **shape)
    cluster = Cluster(nodes=(Node.from_device("n", DeviceCatalog.builtin()[DEVICE], 4),))
    worst = 0.0
    for precision, recompute in (("fp32", False), ("bf16", False), ("bf16", True)):
        this = recomputed if recompute else plan
        label = precision + (" + recompute" if recompute else "")
        training = TrainingSpec(
            global_batch_size=plan.global_batch_size,
            microbatch_sizes=[MICROBATCH],
            precision=None if precision == "fp32" else precision,
        )
        tables = CostTables.for_cluster(model, training, cluster, ProfileSet([measured]))
        predicted = {(t.replica, t.stage): t for t in memory_terms(this, tables)}
        config = EngineConfig(
            model_factory=FACTORY,
            model_kwargs=dict(shape),
            plan=this,
            rank=0,
            data=data,
            precision=precision,
        )
        run = run_local(config, range(args.steps))
        print(f"{label}: counted / predicted bytes per rank (predicted / counted)")
        for spec in topology.ranks_for_plan(this):
            got = run.results[spec.rank][-1].memory
            assert got is not None
            want = predicted[(spec.replica, spec.stage)]
            rows = [
                ("weights", got.weights_bytes, want.weights_bytes),
                ("grads", got.grads_bytes, want.grads_bytes),
                ("optimizer", got.optimizer_bytes, want.optimizer_bytes),
                ("weight copies", got.cast_weight_bytes, want.cast_weight_bytes),
                ("activations", got.activations_peak_bytes, want.activations_bytes),
                ("total", got.total_bytes, want.counted_bytes),
            ]
            cells = []
            for name, counted, pred in rows:
                ratio = pred / counted if counted else float("nan") if pred else 1.0
                if counted:
                    worst = max(worst, abs(ratio - 1))
                cells.append(f"{name} {counted}/{pred:.0f} ({ratio:.3f})")
            print(
                f"  r{spec.replica}s{spec.stage} layers [{spec.layer_indices.start},"
                f"{spec.layer_indices.stop}) in flight {got.microbatches_in_flight}: "
                + ", ".join(cells)
            )
    print(f"largest per-term error: {worst:.1%} (target <= 10%)")


if __name__ == "__main__":
    main()

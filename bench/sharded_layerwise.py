"""Sharded data parallel layer by layer: the step's weights + gradients, counted and predicted,
and its time, at ``optimizer``, ``gradients`` and ``full`` over three whole-model replicas.

Three one-stage replicas with batch shares 4:3:1 (microbatch 1: 4, 3 and 1 rounds) train the
example GPT on this machine's CPU (gloo processes, no Ray; ``worker/local.py``). ``optimizer``
runs the once-a-step path (whole weights and gradients at the peak); ``gradients`` and ``full``
run layer by layer (``worker/layerwise.py``). Prints per level: the counted weights +
gradients and optimizer state of rank 0 at the step's peak (``StepResult.memory``), the cost
model's figures for them (``costmodel/sharding.py``), predicted / counted, and the median step
time over the steps after the first, with its ratio to ``optimizer``'s measured in the same
run, and that ratio predicted: ``optimizer``'s measured step less its measured communication
(step less compute and update) plus the level's per-layer collectives as the cost model charges
them (``sharding.layerwise_collectives_s``) at the gloo cost measured here first
(``worker/collective_cost.py``, among 3 ranks). Nothing passes or fails; the figures go to
docs/benchmarks.md.

Run: .venv/bin/python bench/sharded_layerwise.py [--blocks 8] [--hidden 64] [--steps 4]
"""

from __future__ import annotations

import argparse
import os
import statistics

from orchestrator.costmodel import sharding
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, Sharding
from orchestrator.worker.collective_cost import measure_collective_cost
from orchestrator.worker.data import DataConfig
from orchestrator.worker.engine import EngineConfig
from orchestrator.worker.local import run_local

FACTORY = "orchestrator.models.gpt:make_gpt"
SEQUENCE = 32
SHARES = (4, 3, 1)


def bench_plan(level: str, num_layers: int) -> Plan:
    return Plan.model_validate(
        {
            "global_batch_size": sum(SHARES),
            "microbatch_size": 1,
            "replicas": [
                {
                    "batch_size": b,
                    "stages": [
                        {"layers": [0, num_layers], "device_type": "A100-80", "sharding": level}
                    ],
                }
                for b in SHARES
            ],
        }
    )


def predicted(model: ModelSpec, level: Sharding, k: int) -> tuple[float, float]:
    """(weights + gradients, optimizer state) bytes the cost model charges one holder."""
    training = TrainingSpec(global_batch_size=sum(SHARES), microbatch_sizes=[1])
    layers = range(model.num_planner_layers)
    if sharding.runs_layer_by_layer(bench_plan(level.value, model.num_planner_layers)):
        w, g, o = sharding.layerwise_state_bytes(model, training, layers, level, k)
        return w + g, o
    parts = [sharding.state_parts_bytes(model, training, i, 1) for i in layers]
    masters = sum(sharding.master_bytes(model, training, i, 1) for i in layers)
    # once a step at ``optimizer``: whole weights and gradients, sliced optimizer state
    return sum(p[0] + p[1] for p in parts), (sum(p[2] for p in parts) + masters) / k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("ORCHESTRATOR_LOCAL_THREADS", "1")
    kwargs = {
        "num_layers": args.blocks,
        "hidden_size": args.hidden,
        "num_heads": 4,
        "sequence_length": SEQUENCE,
    }
    model = ModelSpec(name="gpt", vocab_size=256, dtype="fp32", **kwargs)
    layers = model.num_planner_layers
    print(f"load average at start: {os.getloadavg()} on {os.cpu_count()} cores")
    print(f"GPT {args.blocks} blocks x {args.hidden}, sequence {SEQUENCE}, 3 holders 4:3:1, mbs 1")
    cost = measure_collective_cost(ranks=len(SHARES))
    gather = (cost.gather_latency_s, cost.gather_bytes_per_s)
    reduce = (cost.reduce_latency_s, cost.reduce_bytes_per_s)
    print(
        f"gloo among {len(SHARES)} ranks (measured): gather {gather[0] * 1e3:.3f} ms + bytes /"
        f" {gather[1] / 1e9:.3f} GB/s, reduce {reduce[0] * 1e3:.3f} ms + bytes /"
        f" {reduce[1] / 1e9:.3f} GB/s"
    )
    numels = [model.layer_params(i) for i in range(layers)]
    print(
        f"{'level':<10} {'path':<15} {'w+g counted':>12} {'predicted':>10} {'pred/cnt':>8}"
        f" {'opt counted':>12} {'pred/cnt':>8} {'step s':>8} {'/optimizer':>10}"
        f" {'predicted':>10}"
    )
    base_s = base_comm_s = None
    for level in (Sharding.OPTIMIZER, Sharding.GRADIENTS, Sharding.FULL):
        plan = bench_plan(level.value, layers)
        config = EngineConfig(
            model_factory=FACTORY,
            model_kwargs=kwargs,
            plan=plan,
            rank=0,
            data=DataConfig(sequence_length=SEQUENCE),
            optimizer="adam",
            learning_rate=1e-3,
        )
        run = run_local(config, range(args.steps), timeout_s=600)
        memory = run.results[0][-1].memory
        assert memory is not None
        held = memory.weights_bytes + memory.grads_bytes
        want_held, want_opt = predicted(model, level, len(SHARES))
        step_s = statistics.median(
            max(run.results[r][k].step_s for r in run.results) for k in range(1, args.steps)
        )
        # rank 0 runs the most rounds (share 4): its step less its compute and update
        comm_s = statistics.median(
            run.results[0][k].step_s - run.results[0][k].compute_s for k in range(1, args.steps)
        )
        if base_s is None:
            base_s, base_comm_s = step_s, comm_s
        assert base_comm_s is not None
        predicted_s = base_s
        if sharding.runs_layer_by_layer(plan):
            rounds = sharding.layerwise_rounds(plan)
            predicted_s += -base_comm_s + sharding.layerwise_collectives_s(
                numels, 4, 4, level, len(SHARES), rounds, gather, reduce
            )
        path = "layer by layer" if sharding.runs_layer_by_layer(plan) else "once a step"
        print(
            f"{level.value:<10} {path:<15} {held:>12} {want_held:>10.0f} {want_held / held:>8.3f}"
            f" {memory.optimizer_bytes:>12} {want_opt / memory.optimizer_bytes:>8.3f}"
            f" {step_s:>8.3f} {step_s / base_s:>10.2f} {predicted_s / base_s:>10.2f}"
        )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

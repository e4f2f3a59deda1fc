"""Step time per precision on CPU processes (gloo, autocast), the same plan in fp32, bf16, fp16.

One replica of two stages (1F1B, 4 microbatches) of a small GPT, one local process per rank, no
Ray and no emulation: real CPU speed. The figures say what 16-bit autocast costs or saves on this
CPU, not on a GPU (bench/gpu_check.py measures that), and show every precision trains the same
plan end to end. Baseline: fp32, measured in the same run.

Run: python bench/precision_local.py [--steps 6]
"""

from __future__ import annotations

import argparse
import statistics

from orchestrator.spec.plan import Plan
from orchestrator.worker.data import DataConfig
from orchestrator.worker.engine import EngineConfig
from orchestrator.worker.local import run_local

MODEL = {"num_layers": 4, "hidden_size": 128, "num_heads": 4, "sequence_length": 64}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    plan = Plan.model_validate(
        {
            "global_batch_size": 16,
            "microbatch_size": 4,
            "replicas": [
                {
                    "batch_size": 16,
                    "stages": [
                        {"layers": [0, 3], "device_type": "cpu"},
                        {"layers": [3, 6], "device_type": "cpu"},
                    ],
                }
            ],
        }
    )
    rows = []
    for precision in ("fp32", "bf16", "fp16"):
        config = EngineConfig(
            model_factory="orchestrator.models.gpt:make_gpt",
            model_kwargs=dict(MODEL),
            plan=plan,
            rank=0,
            data=DataConfig(sequence_length=MODEL["sequence_length"]),
            precision=precision,
        )
        run = run_local(config, range(args.steps), timeout_s=300)
        # Median step time after one warm-up step, slowest rank of each step.
        per_step = [max(r[s].step_s for r in run.results.values()) for s in range(args.steps)]
        step_s = statistics.median(per_step[1:])
        last_loss = sum(r[-1].loss for r in run.results.values() if r[-1].loss is not None)
        skipped = sum(r.overflow_skipped for r in run.results[0])
        rows.append((precision, step_s, last_loss, skipped))
    base = rows[0][1]
    print(f"{'precision':>9} {'step s':>8} {'vs fp32':>8} {'last loss':>10} {'skipped':>8}")
    for precision, step_s, loss, skipped in rows:
        print(f"{precision:>9} {step_s:>8.3f} {step_s / base:>8.2f} {loss:>10.6f} {skipped:>8}")


if __name__ == "__main__":
    main()

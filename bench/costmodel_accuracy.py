"""Cost model against measured training runs: step time and peak memory, run by run.

Reads a validation file (default: the twelve GPT-Neo-2.7 runs on GH200 nodes that Sailor's authors
measured with Megatron-DeepSpeed, ``tests/fixtures/validation/``), builds each run's plan and
cluster, and prints for every run the measured and predicted step time and peak memory, their
errors, the largest term of the predicted step, and the measured gradient reduction beside the
predicted all-reduce; then the median and p90 of the absolute errors. Step times of these runs rest
on estimated layer times (there is no GH-96 profile of GPT-Neo-2.7: the cost model borrows the
A100-40 one, scaled by the GH-96/A100-40 speed ratio measured on OPT-350); memory does not.

Run: .venv/bin/python bench/costmodel_accuracy.py [--file PATH] [--runtime megatron-deepspeed]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from orchestrator.costmodel.presets import PRESETS
from orchestrator.costmodel.validation import (
    error_summary,
    load_runs,
    microbatch_stage_count,
    predict_runs,
)
from orchestrator.profiles.builtin import builtin_model, builtin_profiles

GIB = 1024**3
DEFAULT_FILE = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "fixtures"
    / "validation"
    / "sailor-gh200-gpt-neo-2.7.json"
)


def _fit(xs: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares ``y ~ x . c`` (normal equations, two unknowns at most)."""
    k = len(xs[0])
    a = [[sum(x[i] * x[j] for x in xs) for j in range(k)] for i in range(k)]
    b = [sum(x[i] * y for x, y in zip(xs, ys, strict=True)) for i in range(k)]
    if k == 1:
        return [b[0] / a[0][0]]
    det = a[0][0] * a[1][1] - a[0][1] * a[1][0]
    return [(b[0] * a[1][1] - b[1] * a[0][1]) / det, (a[0][0] * b[1] - a[1][0] * b[0]) / det]


def leave_one_out(runs, model, preset) -> dict[str, float]:
    """Refit the preset's fitted constants (framework footprint, per-microbatch and per-step
    overheads) without each run in turn and predict that run: errors on runs the fit never saw."""
    bare = replace(preset, framework_bytes=0.0, microbatch_overhead_s=0.0, step_overhead_s=0.0)
    base = predict_runs(runs, model, builtin_profiles(), bare)
    step_errors, memory_errors = [], []
    for held in range(len(runs)):
        rest = [p for i, p in enumerate(base) if i != held]
        # Relative residuals: weight each run by 1 / measured.
        xs = [
            [microbatch_stage_count(p.run) / p.run.measured_step_s, 1 / p.run.measured_step_s]
            for p in rest
        ]
        ys = [
            (p.run.measured_step_s - p.estimate.step_time_s) / p.run.measured_step_s for p in rest
        ]
        per_micro, per_step = _fit(xs, ys)
        mx = [[1 / p.run.measured_peak_memory_bytes] for p in rest]
        my = [
            (p.run.measured_peak_memory_bytes - p.estimate.peak_memory_bytes)
            / p.run.measured_peak_memory_bytes
            for p in rest
        ]
        (footprint,) = _fit(mx, my)
        p = base[held]
        step = p.estimate.step_time_s + microbatch_stage_count(p.run) * per_micro + per_step
        step_errors.append(step / p.run.measured_step_s - 1)
        memory = p.estimate.peak_memory_bytes + footprint
        memory_errors.append(memory / p.run.measured_peak_memory_bytes - 1)
    step_med, step_p90 = error_summary(step_errors)
    mem_med, mem_p90 = error_summary(memory_errors)
    print(
        f"leave-one-out ({len(runs)} runs, the three fitted constants refitted without the run "
        f"predicted): step time |error| median {step_med:.1%}, p90 {step_p90:.1%}; peak memory "
        f"|error| median {mem_med:.1%}, p90 {mem_p90:.1%}"
    )
    return {
        "step_median": step_med,
        "step_p90": step_p90,
        "memory_median": mem_med,
        "memory_p90": mem_p90,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=DEFAULT_FILE)
    parser.add_argument("--runtime", choices=sorted(PRESETS), default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if not args.file.is_file():
        print(f"--file: no such file {args.file}; pass a validation file", file=sys.stderr)
        return 2
    header, runs = load_runs(args.file)
    runtime = args.runtime or header.get("runtime", "orchestrator")
    model = builtin_model(header["model"])
    preds = predict_runs(runs, model, builtin_profiles(), runtime)
    raw = json.loads(args.file.read_text())["runs"]
    suspect = {r["name"]: r.get("suspect", "") for r in raw}
    reduction = {r["name"]: r.get("measured_gradient_reduction_s") for r in raw}

    print(f"{header['source']}; model {model.name}; runtime preset {runtime}")
    print(
        f"{'run':8s} {'step meas':>9s} {'pred':>7s} {'err':>7s}  {'largest term':>18s}  "
        f"{'reduce meas':>11s} {'pred':>6s}  {'mem meas GiB':>12s} {'pred':>6s} {'err':>7s}"
    )
    rows = []
    for p in preds:
        term, seconds = p.largest_term
        worst = max(p.estimate.devices, key=lambda d: d.memory_bytes)
        measured_reduce = reduction.get(p.run.name)
        flag = "  (suspect: see fixture)" if suspect.get(p.run.name) else ""
        print(
            f"{p.run.name:8s} {p.run.measured_step_s:9.3f} {p.estimate.step_time_s:7.3f} "
            f"{p.step_error:+7.1%}  {term:>9s} {seconds:7.3f} s  "
            f"{measured_reduce if measured_reduce is not None else float('nan'):11.3f} "
            f"{worst.allreduce_total_s:6.3f}  "
            f"{p.run.measured_peak_memory_bytes / GIB:12.2f} "
            f"{p.estimate.peak_memory_bytes / GIB:6.2f} "
            f"{p.memory_error:+7.1%}{flag}"
        )
        rows.append(
            {
                "run": p.run.name,
                "measured_step_s": p.run.measured_step_s,
                "predicted_step_s": p.estimate.step_time_s,
                "step_error": p.step_error,
                "largest_term": term,
                "measured_peak_memory_bytes": p.run.measured_peak_memory_bytes,
                "predicted_peak_memory_bytes": p.estimate.peak_memory_bytes,
                "memory_error": p.memory_error,
            }
        )
    summary = {}
    for label, subset in (
        ("all runs", preds),
        ("runs not marked suspect", [p for p in preds if not suspect.get(p.run.name)]),
    ):
        step_med, step_p90 = error_summary([p.step_error for p in subset])
        mem_med, mem_p90 = error_summary([p.memory_error for p in subset])
        summary[label] = {
            "runs": len(subset),
            "step_median": step_med,
            "step_p90": step_p90,
            "memory_median": mem_med,
            "memory_p90": mem_p90,
        }
        print(
            f"{label} ({len(subset)}): step time |error| median {step_med:.1%}, "
            f"p90 {step_p90:.1%}; peak memory |error| median {mem_med:.1%}, p90 {mem_p90:.1%}"
        )
    print("targets: step time median <= 8%, p90 <= 15%; peak memory median <= 8%")
    consistent = [p.run for p in preds if not suspect.get(p.run.name)]
    summary["leave-one-out"] = leave_one_out(consistent, model, PRESETS[runtime])
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": rows, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

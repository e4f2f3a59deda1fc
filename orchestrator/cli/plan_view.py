"""Readable tables for plans and estimates (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

GiB = 1024**3


def _console() -> Console:
    # Wide enough for the tables when output goes to a file or pipe (rich defaults to 80 there).
    console = Console()
    return console if console.is_terminal else Console(width=120)


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.3f} s"


def _stage_table(plan: Any, estimate: Any) -> Table:
    table = Table(title="Plan: replicas and stages", show_lines=False)
    columns = (
        "replica",
        "batch",
        "stage",
        "layers",
        "device",
        "tp",
        "sharding",
        "node",
        "recompute",
    )
    for col in (*columns, "memory / limit"):
        table.add_column(col, justify="right" if col in ("batch", "tp") else "left")
    by_key = {(d.replica, d.stage): d for d in estimate.devices}
    for r, rep in enumerate(plan.replicas):
        for s, stage in enumerate(rep.stages):
            d = by_key[(r, s)]
            mem = f"{d.memory_bytes / GiB:.1f} / {d.memory_capacity_bytes / GiB:.1f} GiB"
            if not d.fits:
                mem = f"[red]{mem} (does not fit)[/red]"
            table.add_row(
                str(r) if s == 0 else "",
                str(rep.batch_size) if s == 0 else "",
                str(s),
                f"[{stage.layers[0]}, {stage.layers[1]})",
                stage.device_type,
                str(stage.tp),
                stage.sharding.value if stage.sharding.value != "none" else "-",
                stage.node or "-",
                "yes" if stage.recompute else "-",  # activation recompute on its blocks
                mem,
            )
    return table


def print_plan_result(
    result: Any, model: Any, training: Any, precision: dict[str, Any] | None = None
) -> None:
    console = _console()
    plan, est = result.plan, result.estimate
    console.print(_stage_table(plan, est))
    console.print(
        f"microbatch size {plan.microbatch_size}, global batch {plan.global_batch_size}, "
        f"{len(plan.replicas)} replicas on {plan.num_devices} devices "
        f"({', '.join(f'{n} {t}' for t, n in sorted(plan.device_counts().items()))})"
    )
    summary = Table(title="Predicted step", show_header=True)
    for col in ("plan", "step time", "throughput", "vs chosen", "note"):
        summary.add_column(col)
    summary.add_row(
        "chosen",
        _fmt_s(est.step_time_s),
        f"{est.throughput_samples_per_s:.1f} samples/s",
        "1.00x",
        "",
    )
    summary.add_row(
        "fluid bound",
        _fmt_s(result.bound.step_time_s),
        f"{training.global_batch_size / result.bound.step_time_s:.1f} samples/s",
        f"chosen is {result.bound_ratio:.2f}x the bound",
        "lower bound, not reachable",
    )
    for name, baseline in result.baselines.items():
        name = name.replace("_", " ")
        if baseline.estimate is None:
            summary.add_row(name, "-", "-", "-", f"infeasible: {baseline.reason}")
        else:
            speedup = baseline.estimate.step_time_s / est.step_time_s
            summary.add_row(
                name,
                _fmt_s(baseline.estimate.step_time_s),
                f"{baseline.estimate.throughput_samples_per_s:.1f} samples/s",
                f"chosen is {speedup:.2f}x faster",
                baseline.reason,
            )
    console.print(summary)
    console.print(
        f"pipeline {_fmt_s(est.pipeline_s)}, all-reduce {_fmt_s(est.allreduce_s)}, "
        f"optimizer {_fmt_s(est.update_s)}; search took {result.search_time_s:.2f} s"
    )
    for line in getattr(result, "choices", ()):
        console.print(line)  # why it shards or not, its tp degrees (planner/layout_note.py)
    if precision is not None:
        console.print(
            f"precision: {precision['planned']} planned; {precision['suits_every_type']} suits "
            f"every planned device type ({precision['reason']})"
        )
        if precision["warning"]:
            console.print(f"[yellow]precision:[/yellow] {precision['warning']}")
    if result.precision_choice is not None:
        choice = result.precision_choice
        console.print(f"precision auto: {choice.precision} chosen: {choice.reason}")
    if result.estimated_device_types:
        console.print(
            "[yellow]estimated:[/yellow] no measured profile of "
            f"{model.name} for {', '.join(result.estimated_device_types)} (all or some layers): "
            "those times come from FLOPs and datasheet peaks"
        )


def print_estimate(plan: Any, est: Any) -> None:
    console = _console()
    console.print(_stage_table(plan, est))
    console.print(
        f"step time {_fmt_s(est.step_time_s)}, throughput {est.throughput_samples_per_s:.1f} "
        f"samples/s, peak memory {est.peak_memory_bytes / GiB:.1f} GiB, "
        f"fits: {'yes' if est.fits else '[red]no[/red]'}"
    )
    if est.estimated_device_types:
        console.print(
            f"[yellow]estimated:[/yellow] {', '.join(est.estimated_device_types)} costed from FLOPs"
        )

"""Draw one training step: devices down, time across, forward/backward per microbatch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from orchestrator.costmodel.schedule import simulate
from orchestrator.errors import UserError

MAX_ROWS = 64  # beyond this, only the first replicas are drawn


def draw_step(plan: Any, estimate: Any, path: Path, title: str = "") -> None:
    """Write a picture of one step (1F1B) to ``path`` (.svg or .png)."""
    if path.suffix.lower() not in (".svg", ".png"):
        raise UserError(
            f"cannot draw to {path.name}", field="--picture", fix="use a .svg or .png file name"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    by_key = {(d.replica, d.stage): d for d in estimate.devices}
    rows: list[tuple[str, list[tuple[float, float, str, str]]]] = []
    for r, rep in enumerate(plan.replicas):
        m = math.ceil(rep.batch_size / plan.microbatch_size)
        per = [by_key[(r, s)] for s in range(len(rep.stages))]
        # Split each stage's per-microbatch time 1:2 between forward and backward (FLOP ratio).
        fwd = [d.microbatch_s / 3 for d in per]
        bwd = [2 * d.microbatch_s / 3 for d in per]
        ops = simulate(fwd, bwd, m)
        end_pipe = max(o.end_s for o in ops)
        for s, d in enumerate(per):
            bars = [
                (o.start_s, o.end_s - o.start_s, "tab:blue" if o.kind == "F" else "tab:green", "")
                for o in ops
                if o.stage == s
            ]
            bars.append((end_pipe, d.allreduce_s, "tab:orange", ""))
            bars.append((end_pipe + d.allreduce_s, d.update_s, "tab:purple", ""))
            rows.append((f"r{r}s{s} {d.device_type} x{d.tp}", bars))
        if len(rows) >= MAX_ROWS:
            break
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(rows) + 1.5))
    for y, (_, bars) in enumerate(rows):
        for start, width, color, _ in bars:
            ax.broken_barh(
                [(start, width)], (y - 0.4, 0.8), facecolors=color, edgecolor="white", linewidth=0.3
            )
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds into the step (white gaps are pipeline bubbles)")
    ax.set_title(title or "one training step", fontsize=10)
    ax.legend(
        handles=[
            Patch(color="tab:blue", label="forward"),
            Patch(color="tab:green", label="backward"),
            Patch(color="tab:orange", label="gradient all-reduce"),
            Patch(color="tab:purple", label="optimizer"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 if len(rows) < 8 else -0.04),
        ncol=4,
        fontsize=7,
    )
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)

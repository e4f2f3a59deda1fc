"""The Ray Train side of bench/recovery.py: one crash and one join against TorchTrainer v2.

The training loop runs in its own driver process (``_raytrain_recovery.py``); this module starts
it on the benchmark's cluster, watches its progress file, crashes a node once ``crash_at_step``
steps are committed, adds a node once training has gone on after the recovery, and stops the
driver when the measurements are in (or a time limit passes). Figures come from the progress
file: the wall time of every committed step and the world size it ran at.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Progress:
    """One committed step: the steps committed after it, its wall time, the world size, and the
    worker group that ran it."""

    done: int
    time_s: float
    world: int
    group: str


def read_progress(path: Path) -> list[Progress]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            rows.append(Progress(int(parts[0]), float(parts[1]), int(parts[2]), parts[3]))
    return rows


def recovery_figures(rows: list[Progress], crashed_at_s: float) -> dict[str, float]:
    """Seconds from the crash to the first step of the restarted worker group, and the steps
    lost (committed by the old group, trained again by the new one).

    A step of the old group can still complete just after the crash (its all-reduce finished
    before the kill); it is not a recovery, so the first step of a *new* group counts.
    """
    before = [r for r in rows if r.time_s <= crashed_at_s]
    if not before:
        return {}
    old_group = before[-1].group
    after = [r for r in rows if r.time_s > crashed_at_s and r.group != old_group]
    if not after:
        return {}
    last = max(r.done for r in rows if r.group == old_group)
    return {
        "recovery_s": after[0].time_s - crashed_at_s,
        "lost_steps": float(max(0, last - (after[0].done - 1))),
        "last_step_before": float(last),
        "resumed_from": float(after[0].done - 1),
    }


def rate_samples_per_s(rows: list[Progress], global_batch: int) -> float:
    """Samples per second over consecutive committed steps (restarts excluded)."""
    gaps = [b.time_s - a.time_s for a, b in itertools.pairwise(rows) if b.done == a.done + 1]
    if not gaps:
        return float("nan")
    gaps.sort()
    median = gaps[len(gaps) // 2]
    return global_batch / median if median > 0 else float("nan")


def join_figures(
    rows: list[Progress], joined_at_s: float, world_before: int, global_batch: int
) -> dict[str, float]:
    """Seconds from the join to the first step at a larger world; throughput before and after."""
    before = [r for r in rows if r.time_s <= joined_at_s and r.world == world_before]
    bigger = [r for r in rows if r.time_s > joined_at_s and r.world > world_before]
    figures = {"samples_per_s_before": rate_samples_per_s(before[-20:], global_batch)}
    if bigger:
        figures["join_to_step_s"] = bigger[0].time_s - joined_at_s
        last = max(
            r.done for r in rows if r.group != bigger[0].group and r.time_s < bigger[0].time_s
        )
        figures["join_lost_steps"] = float(max(0, last - (bigger[0].done - 1)))
        figures["samples_per_s_after"] = rate_samples_per_s(bigger, global_batch)
    return figures


def _wait_until(
    predicate: Callable[[], bool], timeout_s: float, proc: subprocess.Popen[bytes]
) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return predicate()
        time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the driver we started (its own process group) and what it spawned locally."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def run_raytrain(
    cluster: Any,
    work: Path,
    config: Mapping[str, Any],
    *,
    checkpoint_interval: int,
    min_workers: int,
    max_workers: int,
    crash_at_step: int,
    steps_before_join: int,
    join_kind: Any,
    extra_env: Mapping[str, str],
    limit_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Train with TorchTrainer on ``cluster``; crash a node, later add one; return the figures."""
    work.mkdir(parents=True, exist_ok=True)
    progress = work / "progress.txt"
    result_file = work / "result.json"
    cmd = [
        sys.executable, str(HERE / "_raytrain_recovery.py"),
        "--address", cluster.address, "--progress", str(progress),
        "--storage", str(work / "storage"), "--config", json.dumps(dict(config)),
        "--checkpoint-interval", str(checkpoint_interval),
        "--min-workers", str(min_workers), "--max-workers", str(max_workers),
        "--result", str(result_file),
    ]  # fmt: skip
    env = {**os.environ, **extra_env}
    with open(work / "driver.log", "wb") as driver_log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=driver_log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return _drive(
                cluster, proc, progress, config, crash_at_step, steps_before_join, join_kind,
                limit_s, log,
            )  # fmt: skip
        finally:
            _stop(proc)


def _drive(
    cluster: Any,
    proc: subprocess.Popen[bytes],
    progress: Path,
    config: Mapping[str, Any],
    crash_at_step: int,
    steps_before_join: int,
    join_kind: Any,
    limit_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    def done() -> int:
        rows = read_progress(progress)
        return rows[-1].done if rows else 0

    gbs = int(config["global_batch_size"])
    if not _wait_until(lambda: done() >= crash_at_step, limit_s, proc):
        return {"error": f"Ray Train did not reach step {crash_at_step} (see driver.log)"}
    victim = cluster.alive_nodes()[-1]
    crashed_at_s = cluster.crash(victim)
    log(f"  Ray Train: crashed node {victim.node_id[:8]} after step {done()}")
    if not _wait_until(
        lambda: bool(recovery_figures(read_progress(progress), crashed_at_s)), limit_s, proc
    ):
        return {"error": "Ray Train did not resume within the limit"}
    figures: dict[str, Any] = recovery_figures(read_progress(progress), crashed_at_s)
    log(f"  Ray Train: resumed {figures['recovery_s']:.1f} s after the crash")
    resumed = done()
    _wait_until(lambda: done() >= resumed + steps_before_join, limit_s, proc)
    world_before = read_progress(progress)[-1].world
    joined_at_s = time.time()
    cluster.add(join_kind)
    log(f"  Ray Train: added a node at step {done()} (world {world_before})")
    _wait_until(
        lambda: any(
            r.world > world_before and r.time_s > joined_at_s for r in read_progress(progress)
        ),
        limit_s,
        proc,
    )
    switched_at = done()
    # A few steps at the new size for the throughput after.
    _wait_until(lambda: done() >= switched_at + 10, 60.0, proc)
    figures.update(join_figures(read_progress(progress), joined_at_s, world_before, gbs))
    figures["world_before_join"] = world_before
    if "join_to_step_s" not in figures:
        figures["join_note"] = f"no step at a larger world within {limit_s:.0f} s of the join"
    return figures

"""The two sides of bench/goodput.py: a run driven through a schedule of node kills and
replacements, its committed progress recorded against the wall clock.

Each side trains on its own fresh local cluster; the benchmark's main thread kills and adds the
nodes (Ray's ``Cluster`` wants that) while it polls the run. Progress is a list of
``(wall time, committed steps)`` rows, one per step as it was seen: ours from the controller
actor's typed step updates, Ray Train's from its rank 0's progress file. Committed steps may go
back (a restart from a checkpoint); what a time window committed is the committed steps at its
end less those at its start, so work trained twice is counted once.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _ours_side import _worker_nodes
from _raytrain_side import HERE, _stop, read_progress

Row = tuple[float, int]  # (wall time seen, committed steps)


@dataclass
class Schedule:
    """Kill a node every ``period_s`` (``kills`` times) after a reference window without
    failures; each killed node is replaced ``replace_after_s`` later by one of the same kind."""

    reference_s: float
    period_s: float
    kills: int
    replace_after_s: float

    @property
    def total_s(self) -> float:
        return self.reference_s + self.kills * self.period_s


@dataclass
class Timeline:
    """What one side did: its progress rows and the wall times of the schedule."""

    rows: list[Row] = field(default_factory=list)
    started_s: float = float("nan")  # the reference window opens (training warmed up)
    kills_s: list[float] = field(default_factory=list)
    replace_asked_s: list[float] = field(default_factory=list)  # each replacement's start asked
    replaced_s: list[float] = field(default_factory=list)  # ... and its raylet registered
    killed_nodes: list[str] = field(default_factory=list)
    add_failures: list[str] = field(default_factory=list)  # replacements that did not start
    boot_niced: list[bool] = field(default_factory=list)  # each replacement booted at nice 19
    error: str | None = None


def _victim(cluster: Any) -> Any:
    """The oldest alive node hosting a worker (any alive node while none does: a group being
    restarted still loses the node's capacity)."""
    hosts = set(_worker_nodes())
    alive = cluster.alive_nodes()
    return next((n for n in alive if n.node_id in hosts), alive[0])


def drive(
    cluster: Any,
    schedule: Schedule,
    poll: Callable[[], bool],
    rows: Callable[[], list[Row]],
    *,
    warmup_steps: int,
    limit_s: float,
    log: Callable[[str], None],
    name: str,
    low_priority_boot: bool = False,
) -> Timeline:
    """Poll the run until ``warmup_steps`` are committed, then follow the schedule.

    ``low_priority_boot``: each replacement's processes start at nice 19 until an actor there
    starts to train (emulation of a new machine booting on its own CPU, runtime/local_nodes.py).
    """
    t = Timeline()
    deadline = time.monotonic() + limit_s
    while not (rows() and rows()[-1][1] >= warmup_steps):
        if poll() or time.monotonic() > deadline:
            t.error = f"{name} did not reach {warmup_steps} steps"
            t.rows = rows()
            return t
    t.started_s = time.time()
    first_kill_s = t.started_s + schedule.reference_s
    kill_at = [first_kill_s + k * schedule.period_s for k in range(schedule.kills)]
    pending_adds: list[tuple[float, Any]] = []
    end_s = t.started_s + schedule.total_s
    while time.time() < end_s:
        ended = poll()
        now = time.time()
        if kill_at and now >= kill_at[0]:
            kill_at.pop(0)
            victim = _victim(cluster)
            t.kills_s.append(cluster.crash(victim))
            t.killed_nodes.append(victim.node_id)
            steps = rows()[-1][1] if rows() else 0
            log(f"  {name}: killed node {victim.node_id[:8]} at {now - t.started_s:.0f} s "
                f"(committed {steps})")  # fmt: skip
            pending_adds.append((now + schedule.replace_after_s, victim.kind))
        if pending_adds and now >= pending_adds[0][0]:
            _, kind = pending_adds.pop(0)
            t.replace_asked_s.append(now)
            try:
                node = cluster.add(kind, low_priority_boot=low_priority_boot)
            except Exception as exc:  # a raylet that does not register in 30 s on a busy host
                t.add_failures.append(f"{now - t.started_s:.0f} s: {str(exc)[:80]}")
                log(f"  {name}: the replacement node did not start: {str(exc)[:80]}")
            else:
                t.replaced_s.append(time.time())
                t.boot_niced.append(node.boot_niced)
        if ended:
            t.error = f"{name}'s run ended before the schedule did"
            break
    t.rows = rows()
    return t


# -- ours ----------------------------------------------------------------------------------------


def run_ours(
    cluster: Any,
    job_file: Path,
    schedule: Schedule,
    *,
    warmup_steps: int,
    limit_s: float,
    log: Callable[[str], None],
    low_priority_boot: bool = False,
) -> tuple[Timeline, dict[str, Any]]:
    """Our controller actor through the schedule; also its run summary at the end."""
    from orchestrator.runtime.elastic.controller_actor import RunHandle
    from orchestrator.runtime.elastic.session import ElasticJob
    from orchestrator.runtime.elastic.updates import StepDone

    handle = RunHandle.start(ElasticJob.from_file(job_file))
    seen: list[Row] = []
    timings: list[tuple[float, float, list[float]]] = []  # (wall, step s, each rank's compute s)

    def poll() -> bool:
        done = handle.wait(0.05)
        for u in handle.updates():
            if isinstance(u, StepDone):  # stamped when the controller committed it
                seen.append((u.time_s, u.report.step + 1))
                compute = [round(t.compute_s, 4) for t in u.report.stage_timings]
                timings.append((u.time_s, u.report.step_duration_s, compute))
        return bool(done)

    try:
        timeline = drive(cluster, schedule, poll, lambda: seen, warmup_steps=warmup_steps,
                         limit_s=limit_s, log=log, name="ours",
                         low_priority_boot=low_priority_boot)  # fmt: skip
        summary = handle.status().to_json()
        summary["step_timings"] = timings
        # Which processes (threads) still run at a lowered priority at the end: a replacement's
        # boot should have ended (runtime/local_nodes.py) once its actor trained.
        ps = subprocess.run(["ps", "-eLo", "pid,tid,ni,pcpu,args"], capture_output=True, text=True)
        summary["niced_threads"] = [
            " ".join(line.split()[:6])[:160]
            for line in ps.stdout.splitlines()[1:]
            if line.split()[2] not in ("0", "-") and ("ray" in line or "python" in line)
        ]
    finally:
        handle.stop()
    return timeline, summary


# -- Ray Train v2 ----------------------------------------------------------------------------------


def run_raytrain(
    cluster: Any,
    work: Path,
    config: Mapping[str, Any],
    schedule: Schedule,
    *,
    checkpoint_interval: int,
    min_workers: int,
    max_workers: int,
    max_failures: int,
    extra_env: Mapping[str, str],
    warmup_steps: int,
    limit_s: float,
    log: Callable[[str], None],
) -> Timeline:
    """TorchTrainer (elastic ``num_workers=(min, max)``) through the schedule."""
    work.mkdir(parents=True, exist_ok=True)
    progress = work / "progress.txt"
    cmd = [
        sys.executable, str(HERE / "_raytrain_recovery.py"),
        "--address", cluster.address, "--progress", str(progress),
        "--storage", str(work / "storage"), "--config", json.dumps(dict(config)),
        "--checkpoint-interval", str(checkpoint_interval),
        "--min-workers", str(min_workers), "--max-workers", str(max_workers),
        "--max-failures", str(max_failures), "--result", str(work / "result.json"),
    ]  # fmt: skip
    env = {**os.environ, "RAY_TRAIN_V2_ENABLED": "1", **extra_env}

    def rows() -> list[Row]:
        return [(p.time_s, p.done) for p in read_progress(progress)]

    with open(work / "driver.log", "wb") as driver_log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=driver_log, stderr=subprocess.STDOUT, start_new_session=True
        )

        def poll() -> bool:
            time.sleep(0.05)
            return proc.poll() is not None

        try:
            return drive(cluster, schedule, poll, rows, warmup_steps=warmup_steps,
                         limit_s=limit_s, log=log, name="Ray Train")  # fmt: skip
        finally:
            _stop(proc)


# -- figures -------------------------------------------------------------------------------------


def committed_at(rows: list[Row], at_s: float) -> int:
    """Committed steps as last seen at ``at_s`` (0 before the first step)."""
    done = 0
    for t, d in rows:
        if t > at_s:
            break
        done = d
    return done


def lost_steps(rows: list[Row], since_s: float, until_s: float) -> int:
    """Steps trained again in the window: each time the count goes back, the steps between."""
    lost = 0
    prev: int | None = None
    for t, d in rows:
        if t > until_s:
            break
        if prev is not None and d <= prev and t >= since_s:
            lost += prev - (d - 1)
        prev = d
    return lost


def longest_stalls(rows: list[Row], kills_s: list[float], period_s: float) -> list[float]:
    """For each kill, the longest wall time without a new committed step in the period after it
    (a restart's steps that train again count as no progress)."""
    stalls = []
    for k in kills_s:
        best, last_t = 0.0, k
        high = committed_at(rows, k)
        for t, d in rows:
            if t <= k or t > k + period_s:
                continue
            if d > high:
                best, last_t, high = max(best, t - last_t), t, d
        stalls.append(max(best, k + period_s - last_t))  # the schedule runs past each period
    return stalls


def stalled_s(rows: list[Row], since_s: float, until_s: float, normal_gap_s: float) -> float:
    """Seconds of the window spent in gaps between committed steps longer than three normal
    steps (recoveries, plan switches, restarts), the gap before the window's first step too."""
    stalled, last = 0.0, since_s
    for t, _ in rows:
        if t <= since_s:
            continue
        if t > until_s:
            break
        if t - last > 3 * normal_gap_s:
            stalled += t - last
        last = t
    if until_s - last > 3 * normal_gap_s:
        stalled += until_s - last
    return stalled


def median_gap_s(rows: list[Row], since_s: float, until_s: float) -> float:
    """Median wall time between consecutive committed steps in the window."""
    inside = [(t, d) for t, d in rows if since_s <= t <= until_s]
    gaps = sorted(b[0] - a[0] for a, b in itertools.pairwise(inside) if b[1] == a[1] + 1)
    return gaps[len(gaps) // 2] if gaps else float("nan")


def figures(t: Timeline, schedule: Schedule, global_batch: int) -> dict[str, Any]:
    """Committed samples/s in the reference window and under failures, their ratio (goodput),
    steps lost, the longest stall after each kill."""
    if t.error is not None and not t.kills_s:
        return {"error": t.error}
    ref_end = t.started_s + schedule.reference_s
    end = t.started_s + schedule.total_s
    ref = committed_at(t.rows, ref_end) - committed_at(t.rows, t.started_s)
    failed = committed_at(t.rows, end) - committed_at(t.rows, ref_end)
    ref_rate = ref * global_batch / schedule.reference_s
    fail_rate = failed * global_batch / (schedule.kills * schedule.period_s)
    gap_s = median_gap_s(t.rows, t.started_s, ref_end)
    stalled = stalled_s(t.rows, ref_end, end, gap_s)
    training_s = schedule.kills * schedule.period_s - stalled
    out: dict[str, Any] = {
        "reference_samples_per_s": ref_rate,
        "failures_samples_per_s": fail_rate,
        "goodput": fail_rate / ref_rate if ref_rate > 0 else float("nan"),
        "committed_steps_reference": ref,
        "committed_steps_failures": failed,
        # None: nothing was committed after the first kill, so no restart was seen to count.
        "steps_lost": lost_steps(t.rows, ref_end, end)
        if any(r[0] > ref_end for r in t.rows)
        else None,
        "kills": len(t.kills_s),
        "stalls_s": longest_stalls(t.rows, t.kills_s, schedule.period_s),
        "wall_s": schedule.total_s,
        "step_s_reference": gap_s,
        "stalled_s": stalled,  # of the failure periods, in gaps longer than 3 reference steps
        "samples_per_s_between_stalls": failed * global_batch / training_s
        if training_s > 0
        else float("nan"),
    }
    if t.error is not None:
        out["error"] = t.error
    if t.add_failures:
        out["replacements_not_started"] = t.add_failures
    out["replacements_booted_niced"] = t.boot_niced
    return out

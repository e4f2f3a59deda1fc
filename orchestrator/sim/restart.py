"""Checkpoint-restart on the same failure trace: the baseline goodput is compared against.

The model is Ray Train v2's elastic training as measured on the local cluster (docs/benchmarks.md,
"Recovery and join"): after an interruption the whole worker group restarts from the latest
checkpoint that its controller had *registered*, which takes ``restart_s`` plus reading the
checkpoint; when the replacement node joins, the group restarts again (``join_restart_s``) to grow
back, again from the latest registered checkpoint. Everything between that checkpoint and the
event is trained again. A checkpoint counts as registered ``registration_lag_s`` after it was
written (Ray Train's controller collects reports when it polls its workers).

In the baseline's favour: it always trains at the full cluster's step time (never at the smaller
size between a failure and the replacement's join), and its restart does not grow with scale
beyond the checkpoint read.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.sim.trace import FailureTrace

# Measured (docs/benchmarks.md): Ray Train v2 with its defaults, crash -> first step 69.2 s and
# join -> first step at the larger size 67.3 s; its controller polls reports every 2 s.
MEASURED_RESTART_S = 69.2
MEASURED_JOIN_RESTART_S = 67.3
REGISTRATION_LAG_S = 2.0


@dataclass(frozen=True)
class RestartModel:
    step_s: float  # full cluster's step time
    checkpoint_interval_steps: int
    checkpoint_write_s: float  # training pauses while a checkpoint is written
    checkpoint_read_s: float  # added to each restart
    replace_after_s: float
    restart_s: float = MEASURED_RESTART_S
    join_restart_s: float = MEASURED_JOIN_RESTART_S
    registration_lag_s: float = REGISTRATION_LAG_S


@dataclass(frozen=True)
class RestartOutcome:
    committed_steps: int
    sim_s: float
    restarts: int
    lost_steps: int


def simulate_restart(model: RestartModel, trace: FailureTrace) -> RestartOutcome:
    """Play ``trace`` (and a join ``replace_after_s`` after each interruption) through the model."""
    events = sorted(
        [(t, model.restart_s) for t in trace.times_s]
        + [(t + model.replace_after_s, model.join_restart_s) for t in trace.times_s]
    )
    events = [(t, r) for t, r in events if t < trace.horizon_s]
    t, step, lost, restarts = 0.0, 0, 0, 0
    checkpoints: list[tuple[float, int]] = [(0.0, 0)]  # (registered at, step)
    index = 0
    while t < trace.horizon_s:
        if index < len(events) and events[index][0] <= t + model.step_s:
            event_s, restart_s = events[index]
            index += 1
            back_to = max(s for at, s in checkpoints if at <= max(t, event_s))
            checkpoints = [(at, s) for at, s in checkpoints if s <= back_to]
            lost += step - back_to
            step = back_to
            restarts += 1
            # An event inside a restart (event_s < t) starts the restart over at event_s.
            t = max(t, event_s + restart_s + model.checkpoint_read_s)
            continue
        t += model.step_s
        step += 1
        if step % model.checkpoint_interval_steps == 0:
            t += model.checkpoint_write_s
            checkpoints.append((t + model.registration_lag_s, step))
    return RestartOutcome(committed_steps=step, sim_s=t, restarts=restarts, lost_steps=lost)

"""What the controller does with an error from a training step that is not a lost worker.

The error is classified (``policies/failure_kinds.py``):

- a **lost peer** (a collective timed out, a connection broke) is a failure like a lost worker:
  the run recovers from the survivors;
- **out of memory** lowers the usable memory of the device type that ran out to what the error
  measured (through the planner's ``lower_usable_memory``, when it has one), records it, and
  recovers so that the re-plan fits the measured memory (smaller microbatches, recompute,
  another split);
- an error in **user code** fails the run with the error's text (its traceback, when the runtime
  sent one) after saving the last committed step's state as the checkpoint to resume from.
"""

from __future__ import annotations

from orchestrator.control.context import RunContext
from orchestrator.control.events import EventKind
from orchestrator.control.ports import WorkerLost
from orchestrator.control.recovery import RestoreKind, RestoreSource
from orchestrator.control.states import ControllerState, RunningState
from orchestrator.errors import TransientError
from orchestrator.policies.failure_kinds import ClassifiedFailure, FailureKind, classify_failure

GIB = 1024**3


def on_step_error(ctx: RunContext, s: RunningState, error: Exception) -> ControllerState:
    """The next state after ``error`` raised by the step ``ctx.ledger.next_step`` (not a
    :class:`WorkerLost`)."""
    found = classify_failure(error)
    if found.kind is FailureKind.LOST_PEER:
        return ctx.on_failure(WorkerLost((), (), f"lost peer: {found.detail}"), s.name)
    if found.kind is FailureKind.OUT_OF_MEMORY:
        return _out_of_memory(ctx, s, error, found)
    return _user_code(ctx, error)


def _out_of_memory(
    c: RunContext, s: RunningState, error: Exception, found: ClassifiedFailure
) -> ControllerState:
    types = _device_types_of(s, getattr(error, "rank", None))
    lower = getattr(c.planner, "lower_usable_memory", None)
    step = c.ledger.next_step
    where = "host" if found.host else ", ".join(types)
    if lower is None:
        c.record(
            EventKind.FAILURE,
            f"out of memory on {where} at step {step}; the planner cannot lower memory, "
            "recovering on the same plan",
            step=step,
            error=found.detail,
        )
    for device_type in types:
        if lower is None:
            break
        before, now = lower(device_type, found.measured_usable_bytes)
        measured = found.measured_usable_bytes
        c.record(
            EventKind.REPLAN,
            f"out of memory on {device_type}{' (host memory)' if found.host else ''} at step "
            f"{step}: usable memory of {device_type} lowered from {before / GIB:.1f} "
            f"to {now / GIB:.1f} GiB"
            + (f" (measured {measured / GIB:.1f} GiB in use)" if measured else " (step down)")
            + "; re-planning",
            device_type=device_type,
            usable_before_bytes=before,
            usable_bytes=now,
            measured_bytes=measured,
            host=found.host,
            step=step,
        )
    return c.on_failure(WorkerLost((), (), f"out of memory on {where}"), s.name)


def _user_code(c: RunContext, error: Exception) -> ControllerState:
    step = c.ledger.next_step
    restore = None
    try:  # the survivors hold the last committed step: keep it as the checkpoint
        states, sources = c.read_all_layers()
        restore = RestoreSource(
            RestoreKind.REPLICAS,
            resume_step=step,
            states=states,
            layer_sources={layer: f"rank {r}" for layer, r in sources.items()},
        )
    except (WorkerLost, TransientError) as exc:
        c.journal.logger.warning("could not read the survivors' state: %s", exc)
    return c.fail(f"step {step} raised {type(error).__name__}: {error}", restore)


def _device_types_of(s: RunningState, rank: object) -> list[str]:
    """The device type of ``rank`` in the running plan; every type of the plan when unknown."""
    stages = [stage for rep in s.proposal.plan.replicas for stage in rep.stages]
    if isinstance(rank, int) and 0 <= rank < len(stages):
        return [stages[rank].device_type]
    return sorted({stage.device_type for stage in stages})

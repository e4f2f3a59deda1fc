"""Pipeline schedules as lists of actions, one list per stage (pure, no torch).

An action is ``("F", i)`` (forward microbatch ``i``) or ``("B", i)`` (backward of microbatch
``i``). Stages may hold different numbers of layers (uneven stages); the schedule does not care,
only the microbatch count and the stage's position matter.

- **GPipe** (Huang et al. 2019): all forwards, then all backwards in reverse order. Keeps every
  microbatch's activations alive.
- **1F1B** (PipeDream-Flush, Narayanan et al. 2021): stage ``s`` of ``S`` first runs
  ``min(S - s - 1, M)`` warm-up forwards, then alternates one forward and one backward, then
  drains the remaining backwards. Same bubble as GPipe, at most ``S - s`` microbatches in flight.

The transfers between actions, and how they are paired so that no send waits on a receive its
peer cannot post, are ``p2p_order.stage_program``.
"""

from __future__ import annotations

from orchestrator.spec.model import Schedule

Action = tuple[str, int]
FORWARD = "F"
BACKWARD = "B"


def microbatch_sizes(batch_size: int, microbatch_size: int) -> list[int]:
    """Split a replica's batch into microbatches; the last one may be smaller."""
    full, rest = divmod(batch_size, microbatch_size)
    return [microbatch_size] * full + ([rest] if rest else [])


def gpipe(num_microbatches: int) -> list[Action]:
    """All forwards, then all backwards (last microbatch first)."""
    forwards = [(FORWARD, i) for i in range(num_microbatches)]
    backwards = [(BACKWARD, i) for i in reversed(range(num_microbatches))]
    return forwards + backwards


def one_f_one_b(num_microbatches: int, stage: int, num_stages: int) -> list[Action]:
    """Warm-up forwards, steady one-forward-one-backward, cool-down backwards."""
    warmup = min(num_stages - stage - 1, num_microbatches)
    actions: list[Action] = [(FORWARD, i) for i in range(warmup)]
    next_backward = 0
    for i in range(warmup, num_microbatches):
        actions.append((FORWARD, i))
        actions.append((BACKWARD, next_backward))
        next_backward += 1
    actions.extend((BACKWARD, i) for i in range(next_backward, num_microbatches))
    return actions


def actions_for(
    schedule: Schedule | str, num_microbatches: int, stage: int, num_stages: int
) -> list[Action]:
    """The action list of one stage under ``schedule``."""
    kind = Schedule(schedule)
    if kind is Schedule.GPIPE:
        return gpipe(num_microbatches)
    return one_f_one_b(num_microbatches, stage, num_stages)

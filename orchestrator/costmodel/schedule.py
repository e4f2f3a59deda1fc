"""Event-level simulation of one replica's pipeline schedule (1F1B or GPipe).

Used to draw a step (``orchestrator plan --picture``) and to check the closed form
``(m - 1) * max_s T_s + sum_s T_s`` the estimate uses: the simulation never finishes later.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    stage: int
    kind: str  # "F" or "B"
    microbatch: int
    start_s: float
    end_s: float


def stage_order(
    stage: int, num_stages: int, num_microbatches: int, schedule: str
) -> list[tuple[str, int]]:
    """The order in which one stage runs its forwards and backwards."""
    m = num_microbatches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(num_stages - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(m - warmup, m)]
    return order


def simulate(
    forward_s: list[float], backward_s: list[float], num_microbatches: int, schedule: str = "1f1b"
) -> list[Op]:
    """Start and end time of every forward and backward of every stage."""
    p = len(forward_s)
    orders = [stage_order(s, p, num_microbatches, schedule) for s in range(p)]
    cursor = [0] * p
    free_at = [0.0] * p
    done: dict[tuple[str, int, int], float] = {}
    ops: list[Op] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            if cursor[s] == len(orders[s]):
                continue
            kind, i = orders[s][cursor[s]]
            if kind == "F":
                dep = done.get(("F", s - 1, i)) if s > 0 else 0.0
            else:
                dep = done.get(("B", s + 1, i)) if s < p - 1 else done.get(("F", s, i))
            if dep is None:
                continue
            start = max(free_at[s], dep)
            end = start + (forward_s[s] if kind == "F" else backward_s[s])
            done[(kind, s, i)] = end
            free_at[s] = end
            ops.append(Op(s, kind, i, start, end))
            cursor[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise AssertionError("pipeline schedule deadlocked")
    return ops

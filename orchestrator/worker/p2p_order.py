"""A stage's exact order of compute and point-to-point exchanges for one step (pure, no torch).

The runner (``pipeline.py``) executes this program and nothing else, so the order of every
send and receive is data a test can replay against a transport of its own
(``tests/unit/test_p2p_order.py`` checks it against one where a send blocks until its receive is
posted, as a large NCCL send does).

Pairing (Megatron-LM's ``p2p_communication``): the send that follows an action and the receive
the next action needs are posted together as one batch (``torch.distributed.batch_isend_irecv``)
and waited for together. In the 1F1B steady state, stage ``s`` sends activation ``i`` and needs
gradient ``j`` while stage ``s + 1`` sends gradient ``j`` and needs activation ``i + 1``: issued
one after the other (send, then receive) both sides block in their send, each waiting for a
receive the other has not posted. Posted together, each side's receive matches the other's
send, and both batches complete.

Between two ranks each direction carries its messages in program order, which both sides agree
on (the ``k``-th activation sent is the ``k``-th one received), so no tags are needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from orchestrator.worker.schedule import BACKWARD, FORWARD, Action, actions_for


class Payload(StrEnum):
    ACTIVATION = "activation"  # forward output of a stage, to the next stage
    GRADIENT = "gradient"  # gradient of a stage's input, to the previous stage


class Peer(StrEnum):
    PREV = "prev"
    NEXT = "next"


@dataclass(frozen=True)
class CommOp:
    """One send or receive of microbatch ``microbatch``'s ``payload`` with a neighbour."""

    send: bool
    peer: Peer
    payload: Payload
    microbatch: int


@dataclass(frozen=True)
class Compute:
    """Run one schedule action (its inputs have been received)."""

    action: Action


@dataclass(frozen=True)
class Exchange:
    """Post these operations together and wait for all of them."""

    ops: tuple[CommOp, ...]


Instruction = Compute | Exchange


def _recv_before(action: Action, is_first: bool, is_last: bool) -> CommOp | None:
    kind, mb = action
    if kind == FORWARD and not is_first:
        return CommOp(send=False, peer=Peer.PREV, payload=Payload.ACTIVATION, microbatch=mb)
    if kind == BACKWARD and not is_last:
        return CommOp(send=False, peer=Peer.NEXT, payload=Payload.GRADIENT, microbatch=mb)
    return None


def _send_after(action: Action, is_first: bool, is_last: bool) -> CommOp | None:
    kind, mb = action
    if kind == FORWARD and not is_last:
        return CommOp(send=True, peer=Peer.NEXT, payload=Payload.ACTIVATION, microbatch=mb)
    if kind == BACKWARD and not is_first:
        return CommOp(send=True, peer=Peer.PREV, payload=Payload.GRADIENT, microbatch=mb)
    return None


def paired_program(actions: list[Action], stage: int, num_stages: int) -> list[Instruction]:
    """Compute steps with, between them, the previous send and the next receive as one batch."""
    is_first, is_last = stage == 0, stage == num_stages - 1
    program: list[Instruction] = []
    previous: Action | None = None
    for action in [*actions, None]:
        ops = [
            op
            for op in (
                _send_after(previous, is_first, is_last) if previous is not None else None,
                _recv_before(action, is_first, is_last) if action is not None else None,
            )
            if op is not None
        ]
        if ops:
            program.append(Exchange(tuple(ops)))
        if action is not None:
            program.append(Compute(action))
        previous = action
    return program


def stage_program(
    schedule: str, num_microbatches: int, stage: int, num_stages: int
) -> list[Instruction]:
    """The program stage ``stage`` of ``num_stages`` runs for one step under ``schedule``."""
    actions = actions_for(schedule, num_microbatches, stage, num_stages)
    return paired_program(actions, stage, num_stages)

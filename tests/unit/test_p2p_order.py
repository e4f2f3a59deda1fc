"""The pipeline's point-to-point order cannot deadlock, even where a send waits for its receive.

Each stage's program (``p2p_order.stage_program``, the very list ``pipeline.py`` executes) runs in
a thread against a rendezvous transport: a send completes only once the matching receive is
posted and a receive once the matching send is posted, the behaviour of a large NCCL send (no
buffering). An ``Exchange`` posts its operations together and waits for all of them, as
``batch_isend_irecv`` followed by ``wait`` does. Messages between two ranks match in order, per
direction, as torch.distributed's do; the test checks the k-th message sent is the k-th one the
receiver expects (same payload, same microbatch).

The same transport shows that issuing every operation alone (send, then receive, as an
``isend`` followed by a blocking ``irecv`` behaves on one NCCL stream) deadlocks under 1F1B. A
deadlock is detected exactly (every unfinished stage waits and none can proceed) with a timeout
behind it, so a failing case fails, it does not hang.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from orchestrator.worker.p2p_order import (
    CommOp,
    Compute,
    Exchange,
    Instruction,
    Peer,
    stage_program,
)
from orchestrator.worker.schedule import BACKWARD, FORWARD, Schedule

TIMEOUT_S = 10.0


@dataclass
class RendezvousTransport:
    """Unbuffered channels between ranks; every posted op is (kind, src, dst, index)."""

    num_ranks: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    posted: dict[tuple[str, int, int, int], tuple[str, int]] = field(default_factory=dict)
    counters: dict[tuple[str, int, int], int] = field(default_factory=dict)
    waiting: dict[int, list[tuple[str, int, int, int]]] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    deadlocked: bool = False
    mismatches: list[str] = field(default_factory=list)

    def _key(self, rank: int, op: CommOp, peer: int) -> tuple[str, int, int, int]:
        src, dst = (rank, peer) if op.send else (peer, rank)
        kind = "send" if op.send else "recv"
        n = self.counters.get((kind, src, dst), 0)
        self.counters[(kind, src, dst)] = n + 1
        return (kind, src, dst, n)

    @staticmethod
    def _partner(key: tuple[str, int, int, int]) -> tuple[str, int, int, int]:
        kind, src, dst, n = key
        return ("recv" if kind == "send" else "send", src, dst, n)

    def exchange(self, rank: int, ops: list[tuple[CommOp, int]]) -> bool:
        """Post ``ops`` (op, peer rank) together; wait until all are matched. False: deadlock."""
        with self.cond:
            keys = []
            for op, peer in ops:
                key = self._key(rank, op, peer)
                self.posted[key] = (op.payload.value, op.microbatch)
                keys.append(key)
            for key in keys:
                partner = self.posted.get(self._partner(key))
                if partner is not None and partner != self.posted[key]:
                    self.mismatches.append(f"{key}: {self.posted[key]} vs {partner}")
            self.cond.notify_all()
            self.waiting[rank] = keys
            try:
                while not self._matched(keys):
                    if self.deadlocked:
                        return False
                    if self._stuck():
                        self.deadlocked = True
                        self.cond.notify_all()
                        return False
                    if not self.cond.wait(timeout=TIMEOUT_S):
                        self.deadlocked = True
                        self.cond.notify_all()
                        return False
                return True
            finally:
                del self.waiting[rank]

    def _matched(self, keys: list[tuple[str, int, int, int]]) -> bool:
        return all(self._partner(k) in self.posted for k in keys)

    def _stuck(self) -> bool:
        # With the lock held: every unfinished rank waits and none of them is matched, so none
        # can run on and post the operations the others wait for.
        unfinished = set(range(self.num_ranks)) - self.finished
        return unfinished <= set(self.waiting) and not any(
            self._matched(keys) for keys in self.waiting.values()
        )

    def finish(self, rank: int) -> None:
        with self.cond:
            self.finished.add(rank)
            self.cond.notify_all()


def run_programs(programs: list[list[Instruction]]) -> RendezvousTransport:
    """Run one program per stage of one replica, one thread each; returns the transport."""
    transport = RendezvousTransport(len(programs))
    last = len(programs) - 1

    def main(rank: int) -> None:
        try:
            for instr in programs[rank]:
                if isinstance(instr, Exchange):
                    ops = [(op, rank - 1 if op.peer is Peer.PREV else rank + 1) for op in instr.ops]
                    assert all(0 <= peer <= last for _, peer in ops), "op to a missing stage"
                    if not transport.exchange(rank, ops):
                        return
        finally:
            transport.finish(rank)

    threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(len(programs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=2 * TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a stage thread hung past the timeout"
    return transport


def unpaired(program: list[Instruction]) -> list[Instruction]:
    """Every operation alone, in the same order: send, then the next receive, one at a time."""
    out: list[Instruction] = []
    for instr in program:
        if isinstance(instr, Exchange):
            out.extend(Exchange((op,)) for op in instr.ops)
        else:
            out.append(instr)
    return out


COMBINATIONS = [(s, m) for s in range(1, 7) for m in range(1, 9)]


@pytest.mark.parametrize("schedule", [s.value for s in Schedule])
def test_paired_programs_never_deadlock(schedule: str) -> None:
    for num_stages, num_microbatches in COMBINATIONS:
        programs = [
            stage_program(schedule, num_microbatches, s, num_stages) for s in range(num_stages)
        ]
        transport = run_programs(programs)
        where = f"{schedule}, {num_stages} stages, {num_microbatches} microbatches"
        assert not transport.deadlocked, f"deadlock: {where}"
        assert not transport.mismatches, f"messages out of order ({where}): {transport.mismatches}"
        # Every send met its receive: as many of each per channel.
        sends = {k[1:3]: n for k, n in transport.counters.items() if k[0] == "send"}
        recvs = {k[1:3]: n for k, n in transport.counters.items() if k[0] == "recv"}
        assert sends == recvs, where
        assert sum(sends.values()) == 2 * (num_stages - 1) * num_microbatches, where


def test_unpaired_order_deadlocks_under_1f1b() -> None:
    # 2 stages, 2 microbatches: stage 0 sends activation 1 while stage 1 sends gradient 0.
    deadlocks = []
    for num_stages, num_microbatches in [(2, 2), (3, 4), (4, 8), (5, 3)]:
        programs = [
            unpaired(stage_program("1f1b", num_microbatches, s, num_stages))
            for s in range(num_stages)
        ]
        deadlocks.append(run_programs(programs).deadlocked)
    assert all(deadlocks), deadlocks


def test_unpaired_order_is_fine_without_steady_state() -> None:
    # The transport does not call everything a deadlock: one microbatch never overlaps.
    programs = [unpaired(stage_program("1f1b", 1, s, 3)) for s in range(3)]
    assert not run_programs(programs).deadlocked


def test_program_computes_each_action_once_after_its_input() -> None:
    program = stage_program("1f1b", 4, 1, 3)
    computed = [i.action for i in program if isinstance(i, Compute)]
    assert sorted(computed) == sorted(
        [(FORWARD, m) for m in range(4)] + [(BACKWARD, m) for m in range(4)]
    )
    received: set[tuple[str, int]] = set()
    for instr in program:
        if isinstance(instr, Exchange):
            received |= {(op.payload.value, op.microbatch) for op in instr.ops if not op.send}
        else:
            kind, mb = instr.action
            needed = ("activation" if kind == FORWARD else "gradient", mb)
            assert needed in received, f"{instr.action} before its input"
    # Steady state pairs a send with a receive in one exchange.
    assert any(
        isinstance(i, Exchange) and len(i.ops) == 2 and i.ops[0].send != i.ops[1].send
        for i in program
    )

"""Executes a program's exchanges with ``torch.distributed.batch_isend_irecv``.

Each :class:`~orchestrator.worker.p2p_order.Exchange` becomes one batch of ``P2POp``s, posted
together and waited for together (as Megatron-LM's ``p2p_communication`` does), so a send and the
receive paired with it never wait on each other (see ``p2p_order``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from orchestrator.worker.p2p_order import CommOp, Exchange, Payload, Peer


def run_exchange(
    exchange: Exchange,
    prev_rank: int | None,
    next_rank: int | None,
    outgoing: Callable[[CommOp], torch.Tensor],
    buffer_for: Callable[[CommOp], torch.Tensor],
    *,
    prev_sends: Sequence[int] | None = None,
    next_sends: Sequence[int] | None = None,
) -> dict[tuple[Payload, int], torch.Tensor]:
    """Post every op of ``exchange``, wait for all; returns the received tensors by
    (payload, microbatch). ``outgoing`` gives the tensor a send carries, ``buffer_for`` an empty
    buffer for a receive. Receives come from ``prev_rank``/``next_rank``; a send goes to every
    rank of ``prev_sends``/``next_sends`` (default: that one neighbour), possibly none (a
    tensor-parallel position whose output another position delivers)."""
    ops: list[dist.P2POp] = []
    received: dict[tuple[Payload, int], torch.Tensor] = {}
    for op in exchange.ops:
        peer = prev_rank if op.peer is Peer.PREV else next_rank
        assert peer is not None, f"{op} has no neighbour"
        if op.send:
            sends = prev_sends if op.peer is Peer.PREV else next_sends
            tensor = outgoing(op).contiguous()
            for dst in (peer,) if sends is None else sends:
                ops.append(dist.P2POp(dist.isend, tensor, dst))
        else:
            buf = buffer_for(op)
            received[(op.payload, op.microbatch)] = buf
            ops.append(dist.P2POp(dist.irecv, buf, peer))
    if not ops:
        return received
    # The send tensors stay referenced by ``ops`` until every request completed.
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return received


def warm_up(device: torch.device) -> None:
    """A collective on the world group before the first batched p2p.

    With NCCL, the first ``batch_isend_irecv`` on a group must involve all of its ranks unless a
    collective has already created the communicator; one all-reduce does that for every rank.
    """
    flag = torch.zeros(1, device=device)
    dist.all_reduce(flag)

"""Which actors of a group are alive, told at once after a failure instead of after Ray's health
checks.

A crashed node takes its actors with it, but Ray fails their calls only once the GCS declares the
node dead: after ``health_check_failure_threshold`` missed health checks (about 1.4 s with the
local cluster's fast settings, 15 s or more with Ray's defaults). Until then a ping to an actor
there just stays unanswered, and so does one to a live actor whose host is busy, so silence alone
proves nothing. What tells the two apart at once is the node's raylet: a live node's raylet
accepts a TCP connection on its node-manager port (the kernel completes the handshake even
while the process waits for a CPU), a dead machine's refuses it (the process is gone, the host
is up) or does not answer (the host is gone).

:func:`alive_ranks` therefore waits only :data:`SUSPECT_AFTER_S` for every actor to answer a
ping; for the silent ones it tries their nodes' raylets (in parallel, at most
:data:`CONNECT_TIMEOUT_S` each). A silent actor whose raylet cannot be reached is dead now; one
whose raylet answers is waited for as before (up to the grace), and an actor Ray itself reports
dead is dead as always. Only called after a step or another call failed (a broken collective, a
timeout), never on the step path.

What a wrong verdict would cost: a node whose raylet does not accept a connection within
:data:`CONNECT_TIMEOUT_S` while its actor is silent and a peer's collective broke is treated as
lost (its actors are killed, the node is excluded until the rejoin cool-down); no state is lost
with it, since the survivors hold every layer they held or the run falls back to the checkpoint
as for any loss.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from ray.exceptions import RayActorError

# How long every actor gets to answer a ping before the silent ones' nodes are tried: a live
# actor answers on its second thread in milliseconds, even during a step. Short, because the
# verdict does not rest on it: a silent actor whose raylet answers is waited for.
SUSPECT_AFTER_S = 0.05
# How long a node's raylet may take to accept a TCP connection before the node counts as dead.
CONNECT_TIMEOUT_S = 0.5


def raylet_addresses(node_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
    """Ray node id -> (address, node-manager port) of its raylet, for the nodes Ray lists (a
    node Ray already lists dead is left out: it is dead)."""
    wanted = set(node_ids)
    out: dict[str, tuple[str, int]] = {}
    for row in ray.nodes():
        node_id = str(row.get("NodeID", ""))
        if node_id in wanted and row.get("Alive", False):
            out[node_id] = (str(row["NodeManagerAddress"]), int(row["NodeManagerPort"]))
    return out


def reachable(address: tuple[str, int], timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``address`` is accepted within ``timeout_s``."""
    try:
        with socket.create_connection(address, timeout=timeout_s):
            return True
    except OSError:  # refused, unreachable, or timed out
        return False


def unreachable_nodes(node_ids: Iterable[str], timeout_s: float = CONNECT_TIMEOUT_S) -> set[str]:
    """The nodes among ``node_ids`` whose raylet does not accept a connection (or that Ray no
    longer lists alive), tried in parallel."""
    ids = sorted(set(node_ids))
    if not ids:
        return set()
    try:
        addresses = raylet_addresses(ids)
    except Exception:  # the GCS briefly unreachable: no verdict, the grace decides
        return set()
    dead = {n for n in ids if n not in addresses}
    tried = [n for n in ids if n in addresses]
    if tried:
        with ThreadPoolExecutor(max_workers=min(16, len(tried))) as pool:
            answers = list(pool.map(lambda n: reachable(addresses[n], timeout_s), tried))
        dead |= {n for n, ok in zip(tried, answers, strict=True) if not ok}
    return dead


def alive_ranks(
    actors: Sequence[Any],
    node_of_rank: Mapping[int, str],
    among: Iterable[int],
    grace_s: float,
) -> set[int]:
    """The ranks among ``among`` whose actor is alive (see the module docstring).

    ``actors[r]`` answers ``ping``; ``node_of_rank`` maps a rank to its Ray node id. An actor
    still silent after ``grace_s`` on a node whose raylet answers counts as alive: its process is
    stuck, and the caller's timeout names it.
    """
    started = time.monotonic()
    refs = {actors[r].ping.remote(): r for r in sorted(set(among))}
    if not refs:
        return set()
    answered, _ = ray.wait(list(refs), num_returns=len(refs), timeout=SUSPECT_AFTER_S)
    silent = [ref for ref in refs if ref not in answered]
    dead: set[int] = set()
    if silent:
        down = unreachable_nodes(node_of_rank[refs[r]] for r in silent if refs[r] in node_of_rank)
        dead = {refs[ref] for ref in silent if node_of_rank.get(refs[ref]) in down}
        waiting = [ref for ref in silent if refs[ref] not in dead]
        if waiting:
            left_s = max(0.0, grace_s - (time.monotonic() - started))
            more, _ = ray.wait(waiting, num_returns=len(waiting), timeout=left_s)
            answered = [*answered, *more]
    alive = {r for ref, r in refs.items() if ref not in answered and r not in dead}
    for ref in answered:
        try:
            ray.get(ref)
            alive.add(refs[ref])
        except RayActorError:
            pass
    return alive

"""The rendezvous' TCP store served by rank 0 *before* the ranks are asked to join.

Every re-formation (a recovery, a switch onto a joined node) builds a new world group through
``init_process_group(init_method="tcp://host:port")``: rank 0 starts the TCP store's server on
that port, the other ranks connect to it. A rank that tries to connect before the server
listens is refused and retries after a back-off, and torch's back-off is long: measured with
three gloo processes on loopback (torch 2.13), rank 0 reaching ``init_process_group`` 20 ms after
the others made every rank's init take 0.5-0.76 s instead of 5-25 ms
(``tests/dist/test_store_ahead.py`` has the case). In a re-formation rank 0 is rarely first: each
rank first settles its update, tears its old groups down and builds its engine, and the calls
reach the actors one after the other.

So the group asks rank 0 for the rendezvous address (``WorkerActor.where``) and rank 0 starts the
server there and then, on a port the kernel picks, and holds it: by the time any rank joins, the
server listens. ``init_process_group`` on rank 0 then finds it: a store made with
``multi_tenant=True`` shares one server per port within the process (torch's documented
behaviour), so rank 0's own rendezvous store takes the running server instead of binding the
port again. Nothing else changes: the same init method, keys and timeouts for every rank.

Started only where torch is imported already (a survivor, a warmed joiner): starting it would
otherwise import torch on rank 0 before the other ranks are even asked to join (a first launch
imports on every rank at once). There, and wherever the server cannot be started, the port is a
free one as before and rank 0 binds it when it joins.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

# How long the held store's own client waits on the server: it sends nothing, so this bounds
# only its connection to a server in this very process.
_CONNECT_TIMEOUT_S = 30.0


def serve(address: str) -> Any | None:
    """A TCP store server listening on a free port of this host, or None where torch is not
    imported yet or the server cannot start. Keep the returned store until this rank has joined
    the rendezvous on ``store.port``; dropping it then leaves the server to the world group."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    try:
        return dist.TCPStore(
            address,
            0,  # the kernel picks the port: nothing can take it between choosing and binding
            None,
            True,
            timedelta(seconds=_CONNECT_TIMEOUT_S),
            wait_for_workers=False,
            multi_tenant=True,  # what init_process_group's tcp:// rendezvous looks up
            # The backend the tcp:// rendezvous asks for (torch reads the same variable).
            use_libuv=os.environ.get("USE_LIBUV", "1") == "1",
        )
    except (RuntimeError, OSError, ValueError):  # no free port, no such address: as before
        return None

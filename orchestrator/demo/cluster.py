"""A local multi-node Ray cluster of emulated device types, started and stopped by this process.

Every node is a real Ray node (its own raylet and workers) on this machine, one CPU per emulated
device, labelled
with a device type from the catalog and an emulated relative speed (docs/runtime.md, Emulation):
a worker on a node of speed 0.25 stretches its compute four-fold. The head holds no work. Ray's
health checks are shortened so a crashed node is declared dead in about a second and a half.

Only the processes this cluster started are stopped (:meth:`LocalCluster.shutdown`); nothing here
runs ``ray stop``, which would end every Ray cluster on the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.runtime.local_nodes import (
    FAST_HEALTH_CHECKS,
    booting_at_low_priority,
    crash_node,
)
from orchestrator.runtime.local_ray import (
    PrivateRayEnv,
    child_pids,
    kill_started,
    make_private_root,
)
from orchestrator.spec.labels import DEVICE_TYPE_LABEL, EMULATED_SPEED_LABEL

# Each node's object store; Ray's default (30% of RAM per node) would reserve far too much.
OBJECT_STORE_BYTES = 100 * 1024 * 1024


class ClusterStartError(OrchestratorError):
    """The local cluster did not start (every process it started was stopped)."""


def _start_failure_text(exc: Exception) -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    load = ""
    with contextlib.suppress(OSError):
        load = f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    return (
        f"the local Ray cluster did not start: {first}{load}; every process it started was "
        "stopped. On a busy machine, try again when it is quieter"
    )


@dataclass(frozen=True)
class NodeKind:
    """An emulated device type: catalog name, relative speed (fastest = 1.0), devices per node
    (one CPU each: a worker runs one torch thread)."""

    device_type: str
    emulated_speed: float
    num_devices: int = 1

    def labels(self) -> dict[str, str]:
        return {DEVICE_TYPE_LABEL: self.device_type, EMULATED_SPEED_LABEL: str(self.emulated_speed)}


@dataclass
class ClusterNode:
    """One worker node this cluster started."""

    kind: NodeKind
    node_id: str
    handle: Any  # ray._private.node.Node
    alive: bool = True
    boot_niced: bool = False  # started at low priority (emulation of a machine of its own)


class LocalCluster:
    """Head plus emulated nodes; :meth:`crash` SIGKILLs a node, :meth:`add` starts one."""

    def __init__(self, temp_root: str | None = None) -> None:
        self.nodes: list[ClusterNode] = []
        self._cluster: Any = None
        # A private Ray root (runtime/local_ray.py): short, since Ray's Unix socket paths live
        # under it, and this cluster's own, so its address file never meets another cluster's.
        self.temp_dir = make_private_root(temp_root)
        self._env: PrivateRayEnv | None = None
        self.address = ""

    def start(self, kinds: Sequence[NodeKind]) -> None:
        """Start the head (no CPUs: it holds no work) and one node per entry of ``kinds``.

        On any failure every process started here is killed (by pid) before the error goes on.
        """
        os.environ.update(FAST_HEALTH_CHECKS)  # node processes inherit it
        self._env = PrivateRayEnv(self.temp_dir)
        before = child_pids()
        try:
            self._start(kinds)
        except BaseException as exc:
            self._cluster = None
            kill_started(before)
            self._env.restore()
            if isinstance(exc, Exception):  # Ctrl-C and exits go on as they are
                raise ClusterStartError(_start_failure_text(exc)) from exc
            raise

    def _start(self, kinds: Sequence[NodeKind]) -> None:
        from ray.cluster_utils import Cluster

        self._cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "object_store_memory": OBJECT_STORE_BYTES,
                "temp_dir": self.temp_dir,
            },
        )
        self.address = str(self._cluster.address)
        for kind in kinds:
            self.add(kind, wait=False)
        self._cluster.wait_for_nodes()

    def add(
        self, kind: NodeKind, wait: bool = True, low_priority_boot: bool = False
    ) -> ClusterNode:
        """Start one more node of ``kind`` (call from the main thread).

        ``low_priority_boot``: emulate a new machine booting on its own CPU (its processes start
        at nice 19 until an actor there starts to train; ``runtime/local_nodes.py``);
        :attr:`ClusterNode.boot_niced` says whether it applied.
        """
        boot = booting_at_low_priority() if low_priority_boot else contextlib.nullcontext(False)
        with boot as niced:
            handle = self._cluster.add_node(
                num_cpus=kind.num_devices,
                labels=kind.labels(),
                object_store_memory=OBJECT_STORE_BYTES,
                temp_dir=self.temp_dir,
                wait=wait,
            )
        node = ClusterNode(kind, str(handle.node_id), handle, boot_niced=bool(niced))
        self.nodes.append(node)
        return node

    def crash(self, node: ClusterNode) -> float:
        """SIGKILL every process of ``node`` (as a machine failure would); returns the wall time."""
        crashed_at_s = time.time()
        crash_node(self._cluster, node.handle)
        node.alive = False
        return crashed_at_s

    def stop(self, node: ClusterNode) -> None:
        """Stop ``node`` gracefully (Ray sees it leave at once)."""
        self._cluster.remove_node(node.handle, allow_graceful=True)
        node.alive = False

    def alive_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.alive]

    def shutdown(self) -> None:
        """Stop every process this cluster started; safe to call twice."""
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                import ray

                ray.shutdown()
            for node in self.alive_nodes():
                with contextlib.suppress(Exception):
                    self._cluster.remove_node(node.handle, allow_graceful=False)
                node.alive = False
            with contextlib.suppress(Exception):
                self._cluster.shutdown()  # removes the address file in our private root
            self._cluster = None
        if self._env is not None:
            self._env.restore()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

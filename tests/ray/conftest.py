"""One local multi-node Ray cluster shared by the tests of this folder (session scope).

Nodes (fake GPUs, labels as a real cluster carries them; the head holds no work):

- ``A100-80`` x 2 nodes, 2 GPUs each, labelled ``orchestrator.io/device-type``, emulated speed 1.0
- ``L4`` x 1 node, 2 GPUs, labelled with Ray's own ``ray.io/accelerator-type``, emulated speed 0.5

Fake GPUs let placement exercise GPU bundles; no real GPU is present, so workers run torch on the
CPU with gloo. Ray's health checks are shortened (platform-facts.md) so failures show fast, but
less than the demo's (~1.4 s): these tests check what happens after a crash, not how fast it is
detected (``bench/recovery.py`` measures that), and on a loaded 2-core host a raylet that is alive
has been seen to miss ~1.5 s of checks, which a test then took for a crash.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from orchestrator.runtime.local_ray import private_ray_root

A100_LABELS = {"orchestrator.io/device-type": "A100-80", "orchestrator.io/emulated-speed": "1.0"}
L4_LABELS = {"ray.io/accelerator-type": "L4", "orchestrator.io/emulated-speed": "0.5"}
# A node is declared dead after ~4 s without an answer (Ray's default: ~15 s; the demo's: ~1.4 s).
TEST_HEALTH_CHECKS = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "6",
    "RAY_health_check_timeout_ms": "1000",
}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """A head plus three labelled worker nodes; the test process is connected to it."""
    os.environ.update(TEST_HEALTH_CHECKS)
    import ray
    from ray.cluster_utils import Cluster

    # Its own Ray root (as the demo's cluster has): works with TMPDIR set to a new folder.
    with private_ray_root() as root:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": root},
        )
        for _ in range(2):
            cluster.add_node(num_cpus=2, num_gpus=2, labels=A100_LABELS, temp_dir=root)
        cluster.add_node(num_cpus=2, num_gpus=2, labels=L4_LABELS, temp_dir=root)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        try:
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()

"""A local multi-node Ray cluster whose nodes carry emulated device types and speeds.

One Ray node per device, one CPU each (workers run one torch thread), labelled
``orchestrator.io/device-type`` and ``orchestrator.io/emulated-speed``. The head holds no work.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from orchestrator.runtime.local_nodes import FAST_HEALTH_CHECKS


@contextmanager
def emulated_cluster(groups: Sequence[tuple[str, float, int]]) -> Iterator[object]:
    """``groups``: (device type, emulated speed, number of one-device nodes)."""
    os.environ.update(FAST_HEALTH_CHECKS)
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.spec.labels import DEVICE_TYPE_LABEL, EMULATED_SPEED_LABEL

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for device_type, speed, count in groups:
        for _ in range(count):
            cluster.add_node(
                num_cpus=1,
                labels={DEVICE_TYPE_LABEL: device_type, EMULATED_SPEED_LABEL: str(speed)},
            )
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()

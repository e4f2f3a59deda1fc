"""A local multi-node Ray cluster whose nodes carry emulated device types and speeds.

One Ray node per device, one CPU each (workers run one torch thread), labelled
``orchestrator.io/device-type`` and ``orchestrator.io/emulated-speed``. The head holds no work.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from orchestrator.runtime.local_nodes import FAST_HEALTH_CHECKS
from orchestrator.runtime.local_ray import child_pids, kill_started, private_ray_root


@contextmanager
def emulated_cluster(groups: Sequence[tuple[str, float, int]]) -> Iterator[object]:
    """``groups``: (device type, emulated speed, number of one-device nodes).

    The cluster lives in its own Ray temp root (runtime/local_ray.py): it works with ``TMPDIR``
    set to a new folder and never touches another cluster's address file. A failed start
    stops every process it started.
    """
    os.environ.update(FAST_HEALTH_CHECKS)
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.spec.labels import DEVICE_TYPE_LABEL, EMULATED_SPEED_LABEL

    with private_ray_root() as root:
        before = child_pids()
        try:
            cluster = Cluster(
                initialize_head=True, head_node_args={"num_cpus": 0, "temp_dir": root}
            )
            for device_type, speed, count in groups:
                for _ in range(count):
                    cluster.add_node(
                        num_cpus=1,
                        temp_dir=root,
                        labels={DEVICE_TYPE_LABEL: device_type, EMULATED_SPEED_LABEL: str(speed)},
                    )
            ray.init(address=cluster.address, log_to_driver=False)
            cluster.wait_for_nodes()
        except BaseException:
            ray.shutdown()
            kill_started(before)
            raise
        try:
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()

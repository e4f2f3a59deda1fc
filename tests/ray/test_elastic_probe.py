"""The cluster probe's rules and the checkpoint store, on rows shaped as ``ray.nodes()`` returns.

Fast: the probe reads injected rows (the format of Ray 2.60's ``ray.nodes()`` and
``get_draining_nodes()``), so its merging of Ray's view with posted node events is checked
without a cluster; the Ray tests beside it drive the same probe on a live cluster.
"""

from __future__ import annotations

from pathlib import Path

import torch

from orchestrator.runtime.elastic.checkpoints import DirCheckpointStore
from orchestrator.runtime.elastic.probe import RayClusterProbe


def row(node_id: str, labels: dict[str, str], gpus: int = 1, alive: bool = True) -> dict:
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": "10.0.0.1",
        "NodeManagerHostname": f"host-{node_id}",
        "Resources": {"CPU": 1.0, "GPU": float(gpus)},
        "Labels": labels,
    }


ROWS = [
    row("aaaaaaaaaa01", {"orchestrator.io/device-type": "A100-80", "orchestrator.io/pool": "p"}),
    row("bbbbbbbbbb02", {"ray.io/accelerator-type": "L4", "orchestrator.io/pool": "p"}, gpus=2),
    row("cccccccccc03", {"orchestrator.io/device-type": "T4"}),  # another pool
    row(
        "dddddddddd04", {"orchestrator.io/device-type": "T4", "orchestrator.io/pool": "p"}, 1, False
    ),
    row("eeeeeeeeee05", {"ray.io/accelerator-type": "Z9", "orchestrator.io/pool": "p"}),  # unknown
]


def probe(draining: dict[str, int] | None = None) -> RayClusterProbe:
    return RayClusterProbe(
        node_selector={"orchestrator.io/pool": "p"},
        rows=lambda: ROWS,
        draining=lambda: draining or {},
    )


def test_snapshot_reads_types_counts_and_pool() -> None:
    snap = probe().snapshot()
    assert snap.node_ids == {"aaaaaaaaaa01", "bbbbbbbbbb02"}  # dead, other-pool, unknown left out
    assert snap.devices_by_type() == {"A100-80": 1, "L4": 2}


def test_ray_drain_deadline_in_ms_becomes_seconds() -> None:
    snap = probe({"bbbbbbbbbb02": 1_767_225_600_000, "aaaaaaaaaa01": 0}).snapshot()
    assert snap.draining == {"bbbbbbbbbb02": 1_767_225_600.0, "aaaaaaaaaa01": None}
    assert snap.devices_by_type() == {}


def test_posted_events_count_before_ray_notices() -> None:
    p = probe()
    p.post_node_event("host-aaaaaaaaaa01", "not_ready")
    p.post_node_event("bbbbbbbb", "spot_termination", 1_767_225_630.0)  # an id prefix
    snap = p.snapshot()
    assert snap.node_ids == {"bbbbbbbbbb02"}
    assert snap.draining == {"bbbbbbbbbb02": 1_767_225_630.0}
    p.post_node_event("host-aaaaaaaaaa01", "node_joined")  # back: the earlier event is dropped
    assert p.snapshot().node_ids == {"aaaaaaaaaa01", "bbbbbbbbbb02"}
    assert p.snapshot().sequence > snap.sequence


def test_checkpoint_store_keeps_run_state_and_ignores_old_when_not_resuming(
    tmp_path: Path,
) -> None:
    states = {i: {"params": {"w": torch.full((2,), float(i))}, "optimizer": {}} for i in range(3)}
    store = DirCheckpointStore(tmp_path)
    assert store.latest() is None
    store.save(4, states, {"failure_count": 2, "lost_steps_total": 1, "plan": None})
    ref = store.latest()
    assert ref is not None and ref.step == 4
    assert ref.manifest["meta"]["failure_count"] == 2
    loaded = store.load(4)
    assert torch.equal(loaded[2]["params"]["w"], torch.full((2,), 2.0))
    fresh = DirCheckpointStore(tmp_path, resume=False)
    assert fresh.latest() is None  # the old checkpoint belongs to an earlier run
    fresh.save(1, states, {})
    assert fresh.latest() is not None and fresh.latest().step == 1

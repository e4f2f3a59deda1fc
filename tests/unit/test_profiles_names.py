"""Source GPU names map onto catalog names that exist."""

from __future__ import annotations

import pytest

from orchestrator.profiles.names import (
    CEPHALO_DEVICES,
    CEPHALO_NOT_IN_CATALOG,
    SAILOR_DEVICES,
    check_mappings_against,
)
from orchestrator.spec.devices import DeviceCatalog


def test_every_mapping_points_into_the_builtin_catalog() -> None:
    assert check_mappings_against(DeviceCatalog.builtin()) == []


def test_a_missing_catalog_entry_is_reported() -> None:
    catalog = DeviceCatalog([d for d in DeviceCatalog.builtin().all() if d.name != "T4"])
    assert check_mappings_against(catalog) == ["T4"]


def test_sailor_names_are_catalog_names() -> None:
    expected = {"A100-40", "A100-80", "GH-96", "V100-16", "RTX-2080", "RTX-3090", "Titan-RTX"}
    assert set(SAILOR_DEVICES) == expected
    assert all(m.device_type == name for name, m in SAILOR_DEVICES.items())


@pytest.mark.parametrize(
    ("source", "catalog"),
    [
        ("a100x40", "A100-40"),
        ("a100x80", "A100-80"),
        ("h100-nvl", "H100"),
        ("a10g", "A10G"),
        ("a6000", "A6000"),
        ("l4", "L4"),
        ("l40s", "L40S"),
        ("t4", "T4"),
        ("v100", "V100-16"),
        ("v100x16", "V100-16"),
        ("v100x32", "V100-32"),
        ("p40", "P40"),
        ("rtx3090", "RTX-3090"),
    ],
)
def test_cephalo_names(source: str, catalog: str) -> None:
    assert CEPHALO_DEVICES[source].device_type == catalog


def test_h100_nvl_says_what_was_measured() -> None:
    assert "NVL" in CEPHALO_DEVICES["h100-nvl"].measured_as


def test_p100_is_not_mapped() -> None:
    assert "p100" in CEPHALO_NOT_IN_CATALOG and "p100" not in CEPHALO_DEVICES

"""GPU names used by the public profile sources, mapped onto the device catalog's names.

Each source spells GPUs its own way (Cephalo: ``a100x40``; Sailor: ``A100-40``). The tables
below are the only place that knows those spellings; a name missing here is skipped by the
importers with a warning, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.spec.devices import DeviceCatalog


@dataclass(frozen=True)
class DeviceMapping:
    """A source GPU name, the catalog name it maps to, and what was actually measured."""

    source_name: str
    device_type: str
    measured_as: str = ""  # set when the measured part differs from the catalog entry


# Sailor (eth-easl/sailor) names its GPU folders after the part and its memory; the catalog
# uses the same names on purpose, so the mapping is the identity. Checked by a unit test.
SAILOR_DEVICES: dict[str, DeviceMapping] = {
    name: DeviceMapping(name, name)
    for name in ("A100-40", "A100-80", "GH-96", "V100-16", "RTX-2080", "RTX-3090", "Titan-RTX")
}

# Cephalo (benson-guo/cephalo) uses cloud-instance style names.
CEPHALO_DEVICES: dict[str, DeviceMapping] = {
    m.source_name: m
    for m in (
        DeviceMapping("a100x40", "A100-40"),
        DeviceMapping("a100x80", "A100-80"),
        # The catalog's H100 is the SXM5 part; Cephalo measured the PCIe H100 NVL (94 GB,
        # lower clocks), so its numbers are conservative for an SXM H100.
        DeviceMapping("h100-nvl", "H100", measured_as="H100 NVL (PCIe)"),
        DeviceMapping("a10g", "A10G"),
        DeviceMapping("a6000", "A6000"),
        DeviceMapping("l4", "L4"),
        DeviceMapping("l40s", "L40S"),
        DeviceMapping("t4", "T4"),
        # Cephalo's plain "v100" is the 16 GB part (the AWS p3 default), as is "v100x16".
        DeviceMapping("v100", "V100-16"),
        DeviceMapping("v100x16", "V100-16"),
        # A PCIe V100 16 GB: slightly lower clocks than the SXM2 part of the catalog.
        DeviceMapping("v100-pciex16", "V100-16", measured_as="V100 16 GB PCIe"),
        DeviceMapping("v100x32", "V100-32"),
        DeviceMapping("p40", "P40"),
        DeviceMapping("rtx3090", "RTX-3090"),
        DeviceMapping("rtx_3090", "RTX-3090"),
    )
}

# Parts the catalog does not describe; the importers skip them (say so, but do not warn as if
# the name were unknown). The P100 has no catalog entry: define it under a cluster's
# device_types and map it by hand if you need it.
CEPHALO_NOT_IN_CATALOG = frozenset({"p100"})

# When two source names map to one catalog type, the first in this order wins (the SXM part
# before the PCIe one, the explicit name before the ambiguous one).
CEPHALO_PREFERENCE = ("v100x16", "v100", "v100-pciex16", "rtx3090", "rtx_3090")


def check_mappings_against(catalog: DeviceCatalog) -> list[str]:
    """Catalog names the tables point to that the catalog lacks (empty when all is well)."""
    targets = {m.device_type for m in (*SAILOR_DEVICES.values(), *CEPHALO_DEVICES.values())}
    return sorted(t for t in targets if t not in catalog)

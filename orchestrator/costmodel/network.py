"""Bandwidth as a function of message size, from measured network fits.

Collective and point-to-point bandwidth grows with the message size until the link saturates
(latency dominates small messages). Sailor (eth-easl/sailor @ cf2c8e3, MIT) measured it per GPU type
and GPU count and fitted ``GB/s = a x^2 + b x + c`` with ``x = log2(message MB)``, capped at the
largest measured bandwidth; the fits are package data (``data/network/sailor-fits.json``).

* Within a node the fit is the device type's own measurement: it replaces the catalog's nominal
  NVLink/PCIe figure when the type was measured.
* Across nodes the fits were measured on one provider's network, so only their *shape* is used:
  the cluster's configured bandwidth times ``fit(size) / fit(max)``, the fraction of the link a
  message of that size reaches.

Device types or counts without a fit keep the catalog and cluster figures unchanged.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any

GB = 1e9
MB = 1e6
# Below the smallest messages Sailor measured the quadratic is extrapolation; never let it fall
# under this fraction of the saturated bandwidth.
_FLOOR_FRACTION = 0.02


@lru_cache(maxsize=1)
def _fits() -> dict[str, Any]:
    text = resources.files("orchestrator").joinpath("data/network/sailor-fits.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _fit(kind: str, device_type: str, count: int) -> tuple[list[float], float] | None:
    by_count = _fits()[kind].get(device_type)
    if not by_count:
        return None
    # The measured count nearest above (a group of 3 behaves like the measured 4), else the largest.
    counts = sorted(int(c) for c in by_count)
    chosen = next((c for c in counts if c >= count), counts[-1])
    coeffs, max_bytes_per_s = by_count[str(chosen)]
    return [float(c) for c in coeffs], float(max_bytes_per_s)


def _evaluate(coeffs: list[float], max_bytes_per_s: float, message_bytes: float) -> float:
    a, b, c = coeffs
    x = math.log2(max(message_bytes, 1.0) / MB)
    value = (a * x * x + b * x + c) * GB
    return min(max_bytes_per_s, max(value, _FLOOR_FRACTION * max_bytes_per_s))


def intra_node_bandwidth(
    device_type: str, num_devices: int, message_bytes: float, nominal_bytes_per_s: float
) -> float:
    """Bytes/s for a message of ``message_bytes`` among ``num_devices`` devices of one node."""
    if num_devices <= 1:
        return nominal_bytes_per_s
    fit = _fit("intra", device_type, num_devices)
    if fit is None:
        return nominal_bytes_per_s
    return _evaluate(fit[0], fit[1], message_bytes)


def inter_node_fraction(device_type: str, devices_per_node: int, message_bytes: float) -> float:
    """Fraction (0..1] of the configured node-to-node bandwidth a message of this size reaches."""
    fit = _fit("inter", device_type, devices_per_node)
    if fit is None:
        return 1.0
    return _evaluate(fit[0], fit[1], message_bytes) / fit[1]

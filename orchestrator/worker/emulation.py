"""Emulated heterogeneity on CPUs: a slower device type is a stretched compute time.

A Ray node may carry the labels ``orchestrator.io/device-type=<catalog name>`` and
``orchestrator.io/emulated-speed=<relative speed>`` (e.g. ``1.0`` for the fast type and ``0.25``
for one four times slower). A worker on such a node sleeps ``(factor - 1) x`` the measured time of
each forward, backward and optimizer update, where ``factor = fastest speed / node speed``; its
compute then takes ``factor x`` as long, as on the slower device. Emulation never switches itself
on where a real GPU is present, and everything it produces says "emulated".

Pure (no torch), so the Ray side can compute factors in the driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from orchestrator.errors import SpecError

DEVICE_TYPE_LABEL = "orchestrator.io/device-type"
EMULATED_SPEED_LABEL = "orchestrator.io/emulated-speed"

T = TypeVar("T")


def parse_speed(labels: Mapping[str, str], where: str = "node") -> float | None:
    """The node's emulated relative speed, or None when it has none."""
    raw = labels.get(EMULATED_SPEED_LABEL)
    if raw is None:
        return None
    try:
        speed = float(raw)
    except ValueError:
        speed = -1.0
    if not speed > 0:
        raise SpecError(
            f"{where} has {EMULATED_SPEED_LABEL}={raw!r}; it must be a positive number",
            field=EMULATED_SPEED_LABEL,
            fix="label the node with a positive relative speed such as 1.0 or 0.25",
        )
    return speed


def slowdown_factor(node_speed: float | None, fastest_speed: float, gpu_present: bool) -> float:
    """How much to stretch compute on a node: 1.0 on real GPUs or unlabelled nodes."""
    if gpu_present or node_speed is None:
        return 1.0
    if node_speed > fastest_speed:
        raise SpecError(
            f"emulated speed {node_speed} exceeds the fastest speed {fastest_speed}",
            field=EMULATED_SPEED_LABEL,
            fix="pass the largest emulated speed in the cluster as fastest_speed",
        )
    return fastest_speed / node_speed


class Stretcher:
    """Runs a callable and then sleeps ``(factor - 1) x`` its measured time."""

    def __init__(self, factor: float = 1.0) -> None:
        if factor < 1.0:
            raise SpecError(
                f"slowdown factor {factor} is below 1.0; emulation can only slow down",
                field="slowdown_factor",
                fix="compute factors relative to the fastest emulated type (speed 1.0)",
            )
        self.factor = factor
        self.compute_s = 0.0  # measured compute plus the emulated stretch

    @property
    def emulated(self) -> bool:
        return self.factor != 1.0

    def run(self, fn: Callable[[], T], sync: Callable[[], None] | None = None) -> T:
        """Call ``fn``; ``sync`` (e.g. a CUDA synchronize) runs before the clock stops."""
        start = time.perf_counter()
        result = fn()
        if sync is not None:
            sync()
        elapsed_s = time.perf_counter() - start
        if self.factor > 1.0:
            time.sleep((self.factor - 1.0) * elapsed_s)
        self.compute_s += self.factor * elapsed_s
        return result

    def reset(self) -> None:
        self.compute_s = 0.0

"""Emulated heterogeneity on CPUs: a slower device type is a stretched compute time.

A Ray node may carry the labels ``orchestrator.io/device-type=<catalog name>`` and
``orchestrator.io/emulated-speed=<relative speed>`` (e.g. ``1.0`` for the fast type and ``0.25``
for one four times slower). A worker on such a node makes each forward, backward and optimizer
update last ``factor x`` the CPU time it needed (sleeping the difference), where ``factor =
reference speed / node speed``: its compute then takes as long as on the slower device, whatever
else runs on the host's cores. Emulation never switches itself
on where a real GPU is present, and everything it produces says "emulated".

Pure (no torch), so the Ray side can compute factors in the driver.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from orchestrator.errors import SpecError
from orchestrator.spec.labels import EMULATED_SPEED_LABEL

T = TypeVar("T")

# A folder named here makes every process on this host that stretches the same work share its
# reference CPU times (``SharedReferences``); unset: each stretcher learns its own.
SHARED_REFERENCES_ENV = "ORCHESTRATOR_EMULATION_REFERENCES_DIR"


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


class SharedReferences:
    """The least CPU time seen for each key of one piece of work, shared through a file by the
    processes on this host that run that work (emulation only).

    Why: the emulated device's speed is ``factor x`` the work's CPU time on an idle core, a
    property of the host and the work, not of the process. A process that starts (a joiner, a
    restarted worker) would otherwise learn it again from scratch, its first steps slower than
    the device it emulates until it happens to see an idle core. Writes replace the file whole
    (a lost race loses only a lower time that the next write offers again)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_work(cls, signature: str) -> SharedReferences | None:
        """The shared times of the work ``signature`` names, under the folder
        :data:`SHARED_REFERENCES_ENV` gives; None where it is unset."""
        folder = os.environ.get(SHARED_REFERENCES_ENV)
        if not folder:
            return None
        name = hashlib.sha256(signature.encode()).hexdigest()[:24]
        return cls(Path(folder) / f"{name}.json")

    def load(self) -> dict[str, float]:
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or being replaced
            return {}
        return {str(k): float(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def offer(self, key: str, cpu_s: float) -> None:
        """Record ``cpu_s`` for ``key`` where it is below what the file holds."""
        known = self.load()
        if known.get(key, float("inf")) <= cpu_s:
            return
        known[key] = cpu_s
        with contextlib.suppress(OSError):  # emulation's bookkeeping never stops a step
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known))
            tmp.replace(self.path)


class Stretcher:
    """Runs a callable and makes it last ``factor x`` its reference CPU time.

    The emulated device's time is the factor times the *CPU time* of the work (on this thread,
    where torch runs CPU ops with one intra-op thread), not its wall time: other processes that
    share the host's cores (other emulated devices, Ray's daemons) then do not slow an emulated
    device down, so each behaves like a machine of its own.

    CPU time alone is not enough on a small host: two busy threads on sibling hardware threads
    (or sharing caches) each spend more CPU time on the same work, and the stretch would multiply
    that. So work that repeats (the same forward, backward or update at the same size) is given a
    ``key``, and its reference CPU time is the least CPU time seen for that key: the cost of the
    work on an idle core. The emulated device then takes ``factor x`` that, exactly, each time,
    whatever the host does, as a real device would. When the host is so busy that the work's wall
    time exceeds the emulated time, the wall time counts (the host is the bottleneck, and the
    step times say so).

    Work inside a call that is not the device's compute (the layer-by-layer sharded path's
    collectives, issued from the layers' hooks, and the buffers they fill:
    ``worker/layerwise.py``) runs under :meth:`aside`: its CPU time is left out of the stretch
    and its wall time is added to the call's emulated time, as a synchronous collective adds
    to a real device's step. (Stretched, it would be charged ``factor`` times its CPU time
    while its waits for the other ranks hid inside the sleep.)

    Aside blocks cut a call into *segments* of compute, and each segment is paced: before an
    aside block the stretcher sleeps until the compute since the call's start (or the previous
    block) has lasted ``factor x`` its reference CPU time, the least seen for that segment of
    that key (``(key, "segment", i)``). So a collective starts when the emulated device would
    reach it, and ranks that meet at every layer's collective (the layer-by-layer path) arrive
    together as equal devices do. Stretched only at the call's end instead, each rank reached
    each collective after its segment's raw CPU time on a shared host, and every collective
    waited for the rank the host had delayed most: in ``bench/sharded_emulated.py``'s
    layer-by-layer plans the collectives then took 1.5-1.8x what the same collectives take back
    to back (``worker/collective_cost.py``), while the waits were compute of the others that
    the stretch had already charged.
    """

    def __init__(self, factor: float = 1.0, shared: SharedReferences | None = None) -> None:
        if factor < 1.0:
            raise SpecError(
                f"slowdown factor {factor} is below 1.0; emulation can only slow down",
                field="slowdown_factor",
                fix="compute factors relative to the fastest emulated type (speed 1.0)",
            )
        self.factor = factor
        self.base_factor = factor  # from the node's speed label; ``throttle`` multiplies it
        self.compute_s = 0.0  # measured compute plus the emulated stretch
        # Wall seconds of the step's work under :meth:`aside` (its collectives inside the
        # compute calls); part of ``compute_s``.
        self.aside_s = 0.0
        self._reference_cpu_s: dict[Hashable, float] = {}
        self._aside_wall_s = 0.0  # within the current call
        # The current call's segments (see the class docstring): its key, where the open
        # segment began (wall, CPU clocks; None outside :meth:`run`), how many closed, and the
        # emulated seconds (CPU-timed) or compute wall seconds (throttled) of the closed ones.
        self._key: Hashable | None = None
        self._segment: tuple[float, float] | None = None
        self._closed = 0
        self._closed_s = 0.0
        # Shared with this host's other processes doing the same work (None: not shared); keys
        # as their ``repr``.
        self._shared = shared if factor != 1.0 else None
        self._shared_keys: dict[str, float] = self._shared.load() if self._shared else {}

    @property
    def emulated(self) -> bool:
        return self.factor != 1.0

    def run(
        self,
        fn: Callable[[], T],
        sync: Callable[[], None] | None = None,
        key: Hashable | None = None,
    ) -> T:
        """Call ``fn``; ``sync`` (e.g. a CUDA synchronize) runs before the clock stops.

        ``key`` names repeating work (e.g. ``("forward", 8)``): its reference CPU time is the
        least seen so far for the key. Without a key, this call's own CPU time is stretched.
        """
        self._aside_wall_s = self._closed_s = 0.0
        self._closed = 0
        self._key = key
        start = time.perf_counter()
        cpu_start = time.thread_time()
        self._segment = (start, cpu_start)
        try:
            result = fn()
            if sync is not None:
                sync()
            assert self._segment is not None
            last_wall0, last_cpu0 = self._segment
        finally:
            self._segment = None
        end = time.perf_counter()
        wall_s = end - start
        if self.factor == 1.0:  # real speed: what the clock saw
            self.compute_s += wall_s
            return result
        if self.base_factor == 1.0:
            # A full-speed node throttled: what it took, stretched. (Its CPU time would be a
            # different clock from the wall time its unthrottled steps were measured by.)
            compute_wall_s = self._closed_s + end - last_wall0
            emulated_s = self.factor * compute_wall_s + self._aside_wall_s
            time.sleep(max(emulated_s - wall_s, 0.0))
            self.compute_s += emulated_s
            return result
        cpu_s = time.thread_time() - last_cpu0
        if self._closed == 0:  # one segment: the call's own reference
            emulated_s = self.factor * (self._least(key, cpu_s) if key is not None else cpu_s)
        else:
            emulated_s = self._closed_s + self.factor * self._segment_reference(cpu_s)
        emulated_s += self._aside_wall_s
        if emulated_s > wall_s:
            time.sleep(emulated_s - wall_s)
        self.compute_s += max(emulated_s, wall_s)
        return result

    def _segment_reference(self, cpu_s: float) -> float:
        """The reference CPU seconds of the current call's open segment, ``cpu_s`` now."""
        if self._key is None:
            return cpu_s
        return self._least((self._key, "segment", self._closed), cpu_s)

    def _pace(self) -> None:
        """Close the open segment: sleep until it has lasted its emulated time (inside
        :meth:`run` on an emulated or throttled device; see the class docstring)."""
        if self._segment is None or self.factor == 1.0:
            return
        wall0, cpu0 = self._segment
        wall_s = time.perf_counter() - wall0
        if self.base_factor == 1.0:  # throttled full-speed node: its wall time, stretched
            target_s = self.factor * wall_s
            self._closed_s += wall_s
        else:
            target_s = self.factor * self._segment_reference(time.thread_time() - cpu0)
            self._closed_s += max(target_s, wall_s)
        self._closed += 1
        if target_s > wall_s:
            time.sleep(target_s - wall_s)

    @contextmanager
    def aside(self) -> Iterator[None]:
        """Run the body as work beside the current call's compute: timed by the wall clock,
        not stretched, once the compute before it has been paced (see the class docstring).
        Outside :meth:`run` it is only timed."""
        self._pace()
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self._aside_wall_s += end - start
            self.aside_s += end - start
            if self._segment is not None:
                self._segment = (end, time.thread_time())

    def throttle(self, multiplier: float) -> None:
        """Run ``multiplier`` times slower than the node's labelled speed from the next piece of
        work on (1.0: the labelled speed again).

        Stands in for a device whose speed changes while it runs (thermal throttling, a noisy
        neighbour). On a node at full speed (factor 1.0, timed by the wall clock) the work's
        own wall time is stretched; on a slower emulated node, its emulated time. Emulation
        only: the worker refuses it where a real GPU is present.
        """
        if not multiplier >= 1.0:
            raise SpecError(
                f"throttle factor {multiplier} is below 1.0; emulation can only slow down",
                field="factor",
                fix="pass 1.0 (the labelled speed) or more (that many times slower)",
            )
        self.factor = self.base_factor * multiplier

    def _least(self, key: Hashable, cpu_s: float) -> float:
        """The least CPU time for ``key`` with ``cpu_s`` seen now (and told to the shared file
        when it is a new least there)."""
        least = min(cpu_s, self._reference_cpu_s.get(key, cpu_s))
        if self._shared is not None:
            name = repr(key)
            shared = self._shared_keys.get(name, float("inf"))
            if least < shared:
                self._shared.offer(name, least)
                self._shared_keys[name] = least
            least = min(least, shared)
        self._reference_cpu_s[key] = least
        return least

    def adopt_references(self, earlier: Stretcher) -> None:
        """Take over ``earlier``'s reference CPU times (the least of both for each key).

        For a new engine of the same process doing the same work (the same layers, at the same
        keys) as ``earlier``: the emulated device is the same device, and its speed should not
        be learned again from scratch, slower until the least CPU time is seen anew."""
        for key, cpu_s in earlier._reference_cpu_s.items():
            mine = self._reference_cpu_s.get(key, cpu_s)
            self._reference_cpu_s[key] = min(mine, cpu_s)

    def reference_cpu_s(self, key: Hashable) -> float | None:
        """The least CPU time seen for ``key`` (None before its first run)."""
        return self._reference_cpu_s.get(key)

    def reset(self) -> None:
        """Start a new step's compute total (the reference times are kept, and lowered to the
        least times the host's other ranks on the same work have shared since)."""
        self.compute_s = self.aside_s = 0.0
        if self._shared is not None:
            # Ranks that started together run beside each other: read what they have seen,
            # once a step (a small file), not only what the file held at this one's start.
            for name, cpu_s in self._shared.load().items():
                if cpu_s < self._shared_keys.get(name, float("inf")):
                    self._shared_keys[name] = cpu_s

"""Profile a model on every device type of the Ray cluster: one actor per type, on a node of it.

Each actor runs the worker side's profiler (``orchestrator.worker.profiler``) on its node's device,
with the node's emulated slow-down where the node carries an emulated speed and has no real GPU.
The driver keeps a cache per (model, device type) whose key changes when the model does, and
writes one planner profile per type to ``OUT/<model>/<device type>.json``. The driver also times
its own round trip to a node of each type (:func:`measure_round_trip_s`), the one per-step term
the worker cannot measure, into the profile's ``runtime`` section.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import ray

from orchestrator.runtime.actor import WorkerJob, has_real_gpu
from orchestrator.runtime.discovery import RayNode, emulated_reference_speed, slowdown_factor
from orchestrator.spec.profiles import ProfileFile


@dataclass(frozen=True)
class ProfiledType:
    """The outcome for one device type."""

    device_type: str
    path: Path
    from_cache: bool
    emulated: bool
    slowdown_factor: float


# Ranks of the group the gloo collectives are timed in (worker/collective_cost.py): the shard
# groups the emulated benchmarks run here are 3-4 holders.
COLLECTIVE_RANKS = 4


@ray.remote(max_retries=0)
def _profile_remote(request: Any) -> tuple[ProfileFile, Any]:
    """Profile on this node; drop the emulated slow-down where a real GPU is present."""
    from orchestrator.worker.collective_cost import measure_collective_cost
    from orchestrator.worker.p2p_latency import measure_p2p_latency_s
    from orchestrator.worker.profiler import profile

    gpu = has_real_gpu()
    if gpu:
        request = replace(request, slowdown_factor=1.0)
    result = profile(request)
    if not gpu and result.runtime is not None:
        # Ranks on CPU nodes talk over gloo: its per-message latency, and the layer-by-layer
        # sharded path's per-collective cost, on this node.
        cost = measure_collective_cost(ranks=COLLECTIVE_RANKS)
        constants = result.runtime.model_copy(
            update={"p2p_latency_s": measure_p2p_latency_s(), **asdict(cost)}
        )
        result = result.model_copy(update={"runtime": constants})
    return result, request


@ray.remote(num_cpus=0, max_restarts=0)
class _Echo:
    """A do-nothing actor on a node: the driver times its calls (the round trip of a step)."""

    def step(self, step: int) -> dict[str, Any]:
        # A reply of about a step report's size (a handful of numbers per rank).
        return {"step": step, "rank": 0, "compute_s": 0.0, "step_s": 0.0, "loss": None}


def measure_round_trip_s(node: RayNode, warmup: int = 3, repeats: int = 15) -> float:
    """Median seconds of one driver call to an actor on ``node`` and its reply: what the
    driver's step costs beyond the rank's own work (the driver calls every rank at once and
    gathers the replies, so one call's round trip stands for the step's)."""
    selector = _selector(node)
    options: dict[str, Any] = {"label_selector": selector} if selector else {}
    actor = _Echo.options(**options).remote()  # type: ignore[attr-defined]
    try:
        for i in range(warmup):
            ray.get(actor.step.remote(i))
        times = []
        for i in range(repeats):
            start = time.perf_counter()
            ray.get(actor.step.remote(i))
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        ray.kill(actor)


# Timed runs per emulated piece. An emulated rank stretches each piece to the least CPU time it
# has seen for it over the whole run (worker/emulation.py): hundreds of calls (every microbatch
# of every step), and on a shared host the least of more samples is lower. The profile takes the
# least over its repeats, so it needs many to stand for that: on a 2-core host with other work
# the least of 7 stood 6-30% above the least of 100, that of 30 within 0-10%. Emulated profiling
# only reads CPU clocks (it does not sleep the stretch), so the repeats cost CPU time alone.
EMULATED_REPEATS = 30


def _request(
    job: WorkerJob,
    device_type: str,
    microbatch_sizes: Sequence[int],
    factor: float,
    warmup: int,
    repeats: int,
) -> Any:
    from orchestrator.worker.data import DataConfig
    from orchestrator.worker.profiler import ProfileRequest

    return ProfileRequest(
        model_factory=job.model_factory,
        model_kwargs=dict(job.model_kwargs),
        device_type=device_type,
        microbatch_sizes=tuple(sorted(set(microbatch_sizes))),
        data=DataConfig(**job.data),
        optimizer=job.optimizer,
        slowdown_factor=factor,
        warmup=warmup,
        repeats=max(repeats, EMULATED_REPEATS) if factor != 1.0 else repeats,
        seed=job.seed,
    )


def _selector(node: RayNode) -> dict[str, str]:
    return {node.type_label: node.device_type} if node.type_label else {}


def profile_device_types(
    job: WorkerJob,
    nodes: Sequence[RayNode],
    microbatch_sizes: Sequence[int],
    out_dir: Path,
    cache_dir: Path,
    force: bool = False,
    out: Callable[[str], None] = print,
    warmup: int = 2,
    repeats: int = 7,
) -> list[ProfiledType]:
    """Profile every device type present in ``nodes`` (one actor each, run one after another).

    Each time is the median of ``repeats`` runs after ``warmup`` untimed ones: medians of a few
    more runs than the profiler's default keep a busy machine's outliers out of the plan.
    """
    from orchestrator.spec.profiles import read_profile
    from orchestrator.telemetry.logs import progress
    from orchestrator.worker.model_api import build_model
    from orchestrator.worker.profiler import ProfileCache, write_profile

    model_name = build_model(job.model_factory, dict(job.model_kwargs)).name
    cache = ProfileCache(cache_dir)
    reference = emulated_reference_speed(nodes)
    first_of_type: dict[str, RayNode] = {}
    for node in nodes:
        first_of_type.setdefault(node.device_type, node)
    results: list[ProfiledType] = []
    # A bar on a terminal (quiet otherwise): profiling is the slow part of a first run.
    with progress(f"profiling {model_name}", len(first_of_type)) as bar:
        for device_type, node in sorted(first_of_type.items()):
            factor = slowdown_factor(node, reference) if node.emulated else 1.0
            request = _request(job, device_type, microbatch_sizes, factor, warmup, repeats)
            cached = cache.path(request, model_name)
            from_cache = cached.is_file() and not force
            if from_cache:
                result = read_profile(cached)
            else:
                tag = f" (emulated x{factor:g})" if node.emulated else ""
                out(f"profiling {model_name} on {device_type}{tag} ...")
                selector = _selector(node)
                options: dict[str, Any] = {"label_selector": selector} if selector else {}
                if node.uses_gpus:
                    options["num_gpus"] = 1
                result, request = ray.get(_profile_remote.options(**options).remote(request))
                if node.emulated and not result.emulated:
                    # An emulated type at the reference speed is stretched x1, but still emulated.
                    source = f"{result.source}; emulated device type (CPU at reference speed)"
                    result = result.model_copy(update={"emulated": True, "source": source})
                write_profile(result, cache.path(request, model_name))
            if result.runtime is not None and result.runtime.round_trip_s is None:
                # The driver's side of a step, which the worker cannot see (kept in the cache).
                constants = result.runtime.model_copy(
                    update={"round_trip_s": measure_round_trip_s(node)}
                )
                result = result.model_copy(update={"runtime": constants})
                write_profile(result, cache.path(request, model_name))
            target = out_dir / _safe(result.model) / f"{_safe(device_type)}.json"
            write_profile(result, target)
            factor = request.slowdown_factor
            results.append(ProfiledType(device_type, target, from_cache, result.emulated, factor))
            bar.advance()
    return results


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)

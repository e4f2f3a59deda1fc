"""``orchestrator profile``'s machinery: one profiler actor per device type, on a node of it.

No timing assertions: the figures depend on the machine. What must hold: one profile per device
type present, in the planner's format, covering every planner layer and microbatch size; the
emulated type says so with its factor; the runtime section carries the time terms; a second run
comes from the cache.
"""

from __future__ import annotations

from pathlib import Path

from ray_plans import NUM_PLANNER_LAYERS, tiny_job

from orchestrator.runtime.discovery import discover_nodes
from orchestrator.runtime.profiling import profile_device_types
from orchestrator.spec.profiles import ProfileSet


def test_profiles_every_device_type_and_caches(ray_cluster: object, tmp_path: Path) -> None:
    job = tiny_job()
    nodes = discover_nodes()
    first = profile_device_types(job, nodes, [1, 2], tmp_path / "out", tmp_path / "cache")
    assert [(p.device_type, p.emulated, p.slowdown_factor) for p in first] == [
        ("A100-80", True, 1.0),  # labelled speed 1.0: the reference, emulated but unstretched
        ("L4", True, 2.0),  # labelled speed 0.5
    ]
    assert not any(p.from_cache for p in first)
    profiles = ProfileSet.load([tmp_path / "out"])
    assert profiles.device_types() == ["A100-80", "L4"]
    for device_type in ("A100-80", "L4"):
        assert profiles.is_emulated(device_type)
        for mbs in (1, 2):
            entry = profiles.lookup(device_type, mbs, 1)
            assert entry is not None and sorted(entry.layers) == list(range(NUM_PLANNER_LAYERS))
        # The runtime's time terms, the driver's round trip to a node of the type among them.
        constants = profiles.runtime_constants(device_type, with_time_terms=True)
        assert constants is not None
        assert constants.microbatch_overhead_s is not None and constants.microbatch_overhead_s > 0
        assert constants.step_overhead_s is not None
        assert constants.round_trip_s is not None and 0 < constants.round_trip_s < 5.0
        # CPU nodes: gloo's per-message latency, measured on the node.
        assert constants.p2p_latency_s is not None and 0 < constants.p2p_latency_s < 0.05
        # and the layer-by-layer sharded path's per-collective cost
        assert constants.gather_latency_s is not None
        assert 0 < constants.gather_latency_s < 0.05
        assert constants.reduce_bytes_per_s is not None and constants.reduce_bytes_per_s > 0
    second = profile_device_types(job, nodes, [1, 2], tmp_path / "out", tmp_path / "cache")
    assert all(p.from_cache for p in second)
    # The cache keeps the round trip: a cached profile is not timed again.
    again = ProfileSet.load([tmp_path / "out"])
    for device_type in ("A100-80", "L4"):
        kept = again.runtime_constants(device_type, with_time_terms=True)
        measured = profiles.runtime_constants(device_type, with_time_terms=True)
        assert kept is not None and measured is not None
        assert kept.round_trip_s == measured.round_trip_s

"""The profiler writes the planner's profile format, emulates slower types, and caches by model."""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_cases import GPT_FACTORY

from orchestrator.spec.profiles import ProfileSet, read_profile
from orchestrator.worker.data import DataConfig
from orchestrator.worker.profiler import ProfileCache, ProfileRequest, profile, write_profile

KWARGS = {"num_layers": 2, "hidden_size": 32, "num_heads": 4, "sequence_length": 16}


def request(**overrides: object) -> ProfileRequest:
    fields: dict[str, object] = {
        "model_factory": GPT_FACTORY,
        "model_kwargs": dict(KWARGS),
        "device_type": "A100-80",
        "microbatch_sizes": (1, 4),
        "data": DataConfig(sequence_length=16),
        "warmup": 1,
        "repeats": 2,
    }
    fields.update(overrides)
    return ProfileRequest(**fields)  # type: ignore[arg-type]


def test_profile_covers_every_layer_and_microbatch(tmp_path: Path) -> None:
    result = profile(request())
    assert not result.emulated and "emulated" not in result.source
    assert [e.microbatch_size for e in result.entries] == [1, 4]
    for entry in result.entries:
        assert sorted(entry.layers) == [0, 1, 2, 3]
        for timing in entry.layers.values():
            assert timing.forward_s > 0 and timing.backward_s > 0 and timing.update_s > 0
    small, large = result.entries[0].layers, result.entries[1].layers
    # a block saves ~4x the activations for 4x the samples; parameters do not change
    assert 3 * small[1].activation_bytes < large[1].activation_bytes
    assert (
        small[1].param_bytes
        == large[1].param_bytes
        == 4 * (4 * 32 * 32 + 2 * 32 * 128 + 9 * 32 + 128)
    )

    path = tmp_path / "profiles" / "gpt.json"
    write_profile(result, path)
    assert read_profile(path) == result
    assert ProfileSet.load([tmp_path / "profiles"]).lookup("A100-80", 4, 1) is not None


def test_emulated_profile_says_so() -> None:
    result = profile(request(device_type="T4", slowdown_factor=4.0, microbatch_sizes=(2,)))
    assert result.emulated
    assert "emulated: times stretched x4" in result.source


def test_cache_hits_and_changes_with_the_model(tmp_path: Path) -> None:
    cache = ProfileCache(tmp_path)
    first, cached = cache.get_or_profile(request(microbatch_sizes=(1,)))
    assert not cached
    again, cached = cache.get_or_profile(request(microbatch_sizes=(1,)))
    assert cached and again == first
    wider = request(microbatch_sizes=(1,), model_kwargs={**KWARGS, "hidden_size": 64})
    assert cache.key(wider) != cache.key(request(microbatch_sizes=(1,)))
    _, cached = cache.get_or_profile(wider)
    assert not cached
    other_type = request(microbatch_sizes=(1,), device_type="L4")
    assert cache.path(other_type, "gpt-tiny") != cache.path(
        request(microbatch_sizes=(1,)), "gpt-tiny"
    )


def test_profile_measures_the_runtimes_time_outside_its_pieces() -> None:
    """The runtime section carries the per-microbatch and per-step seconds a rank spends
    outside its timed pieces (worker/runtime_terms.py); emulated, the stretch's late wake-ups
    are among them, so a stretched run spends more there than an unstretched one."""
    plain = profile(request(microbatch_sizes=(2,))).runtime
    assert plain is not None
    assert plain.microbatch_overhead_s is not None and plain.microbatch_overhead_s > 0
    assert plain.step_overhead_s is not None and plain.step_overhead_s >= 0
    assert plain.round_trip_s is None  # the driver's side: measured by runtime/profiling.py
    # Each microbatch costs well under the pieces it schedules (a tiny model: milliseconds).
    assert plain.microbatch_overhead_s < 0.05


def test_runtime_terms_line_goes_through_its_two_points() -> None:
    import torch

    from orchestrator.worker.data import make_dataset
    from orchestrator.worker.layers import build_layers
    from orchestrator.worker.model_api import build_model
    from orchestrator.worker.runtime_terms import measure_runtime_terms

    model = build_model(GPT_FACTORY, dict(KWARGS))
    layers = build_layers(model, range(model.num_planner_layers), 0, torch.device("cpu"))
    inputs, targets = make_dataset(DataConfig(sequence_length=16), 0).batch(0, 8, 0, 8)
    terms = measure_runtime_terms(model, layers, inputs, targets, 2, 2.0, "adam", many=4)
    (m1, o1), (m4, o4) = terms.points
    assert (m1, m4) == (1, 4)
    # Time outside the pieces at both points; the line (never negative) goes through them.
    assert o1 > 0 and o4 > 0
    assert terms.microbatch_overhead_s == pytest.approx(max(0.0, (o4 - o1) / 3))
    assert terms.step_overhead_s == pytest.approx(max(0.0, o1 - terms.microbatch_overhead_s))
    # The layers are left with no gradients, as the profiler's other measurements expect.
    assert all(p.grad is None for layer in layers.values() for p in layer.parameters())


def test_call_terms_fit_chains_of_blocks_timed_as_one_call() -> None:
    """Chains of k = 1, 2, ... blocks, each as one forward and one backward call: the per-call
    seconds are the line's intercept where it stands out of the points' scatter (else 0),
    stretched by the emulated factor as the runtime stretches a call; the profile's runtime
    section carries them."""
    import torch

    from orchestrator.worker.call_terms import call_intercept, measure_call_overhead
    from orchestrator.worker.data import make_dataset
    from orchestrator.worker.layers import build_layers
    from orchestrator.worker.model_api import build_model

    kwargs = dict(KWARGS, num_layers=4)
    model = build_model(GPT_FACTORY, kwargs)
    layers = build_layers(model, range(model.num_planner_layers), 0, torch.device("cpu"))
    inputs, _ = make_dataset(DataConfig(sequence_length=16), 0).batch(0, 2, 0, 2)
    calls = measure_call_overhead(model, layers, inputs, 3.0, warmup=1, repeats=3)
    assert calls is not None
    assert [k for k, _, _ in calls.points] == [1, 2, 4]
    # Longer chains take longer: the points measure the layers, not only the calls.
    forward = [f for _, f, _ in calls.points]
    assert forward[-1] > forward[0] > 0
    assert calls.forward_s == call_intercept([(k, f) for k, f, _ in calls.points])
    assert calls.backward_s == call_intercept([(k, b) for k, _, b in calls.points])
    assert all(p.grad is None for layer in layers.values() for p in layer.parameters())
    # A model of one block has no line to fit: the profile then carries no call terms.
    one = profile(request(model_kwargs=dict(KWARGS, num_layers=1), microbatch_sizes=(2,)))
    assert one.runtime is not None and one.runtime.call_forward_s is None
    two = profile(request(microbatch_sizes=(2,))).runtime
    assert two is not None and two.call_forward_s is not None and two.call_backward_s is not None


def test_gloo_latency_between_two_local_ranks() -> None:
    """Two spawned gloo ranks bounce a 4-byte tensor: one message costs a positive time, well
    under the link's time for a boundary activation (milliseconds at most on any host)."""
    from orchestrator.worker.p2p_latency import measure_p2p_latency_s

    latency_s = measure_p2p_latency_s(warmup=2, repeats=10)
    assert 0 < latency_s < 0.05


def test_emulated_layers_are_scaled_to_the_stage_call_in_context() -> None:
    """Emulated: every layer's forward and backward is the isolated figure times the ratio of the
    whole model as one stretched call to the layers' sum (worker/in_context.py); the source line
    names the ratios, and the per-call terms are not charged on top."""
    import re

    result = profile(request(device_type="T4", slowdown_factor=4.0, microbatch_sizes=(2, 4)))
    found = re.findall(r"mb(\d+) x([\d.]+)/x([\d.]+)", result.source)
    assert [int(m) for m, _, _ in found] == [2, 4]
    assert all(float(f) > 0 and float(b) > 0 for _, f, b in found)
    assert result.runtime is not None and result.runtime.call_forward_s is None


def test_gloo_collective_cost_among_local_ranks() -> None:
    """Three spawned gloo ranks time the gathers, reductions and all-reduces: for each
    a positive latency (milliseconds at most on any host) and a positive rate."""
    from orchestrator.worker.collective_cost import measure_collective_cost

    cost = measure_collective_cost(ranks=3, warmup=2, repeats=10)
    for latency_s in (cost.gather_latency_s, cost.reduce_latency_s, cost.allreduce_latency_s):
        assert 0 <= latency_s < 0.05
    for rate in (cost.gather_bytes_per_s, cost.reduce_bytes_per_s, cost.allreduce_bytes_per_s):
        assert rate > 1e6

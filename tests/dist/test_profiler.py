"""The profiler writes the planner's profile format, emulates slower types, and caches by model."""

from __future__ import annotations

from pathlib import Path

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

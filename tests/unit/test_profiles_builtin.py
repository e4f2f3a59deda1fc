"""The profiles and models shipped with the package: each validates and fits its model."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from orchestrator.errors import SpecError
from orchestrator.profiles import builtin_model, builtin_model_names, builtin_profiles
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.profiles import ProfileFile

DATA = resources.files("orchestrator").joinpath("data")
SHIPPED_MODELS = ["GPT-2.7B-s512", "GPT-Neo-2.7", "LLaMA-7B-s512", "OPT-30", "OPT-350"]


def shipped_profile_files() -> list[tuple[str, ProfileFile]]:
    out = []
    for source in ("sailor", "cephalo"):
        for model_dir in sorted(DATA.joinpath("profiles", source).iterdir(), key=lambda e: e.name):
            if not model_dir.is_dir():
                continue
            for f in sorted(model_dir.iterdir(), key=lambda e: e.name):
                raw = json.loads(f.read_text())
                out.append((f"{source}/{model_dir.name}/{f.name}", ProfileFile.model_validate(raw)))
    return out


def test_models_are_the_expected_ones() -> None:
    assert builtin_model_names() == SHIPPED_MODELS
    # OPT-350 has 24 blocks, so 26 planner layers as in the Sailor profiles
    assert builtin_model("OPT-350").num_planner_layers == 26
    assert builtin_model("GPT-Neo-2.7").num_planner_layers == 34


def test_every_shipped_profile_fits_its_model() -> None:
    files = shipped_profile_files()
    assert len(files) >= 25
    catalog = DeviceCatalog.builtin()
    for where, profile in files:
        model = builtin_model(profile.model)
        assert profile.device_type in catalog, where
        assert where.endswith(f"/{profile.model}/{profile.device_type}.json"), where
        assert profile.sequence_length == model.sequence_length, where
        assert profile.dtype == model.dtype.value, where
        blocks = list(range(1, model.num_layers + 1))
        for entry in profile.entries:
            layers = sorted(entry.layers)
            if where.startswith("sailor/"):
                assert layers == [0, *blocks, model.num_layers + 1], where  # every layer
            else:
                assert layers == blocks, where  # Cephalo measured blocks only
            for timing in entry.layers.values():
                assert timing.forward_s + timing.backward_s > 0, where


def test_sailor_memory_matches_the_model_shape() -> None:
    # Sailor's per-block parameter count equals the model formula 4h^2 + 2hf + 9h + f exactly.
    for name in ("OPT-350", "GPT-Neo-2.7", "OPT-30"):
        model = builtin_model(name)
        profiles = builtin_profiles(name)
        entry = profiles.lookup(profiles.device_types()[0], 1, 1)
        assert entry is not None
        assert entry.layers[1].param_bytes == model.layer_params(1) * model.dtype.size_bytes


@pytest.mark.parametrize(
    ("model", "device_types"),
    [
        (
            "OPT-350",
            ["A100-40", "A100-80", "GH-96", "RTX-2080", "RTX-3090", "Titan-RTX", "V100-16"],
        ),
        ("GPT-Neo-2.7", ["A100-40", "A100-80", "V100-16"]),
    ],
)
def test_sailor_models_cover_every_profiled_gpu(model: str, device_types: list[str]) -> None:
    assert builtin_profiles(model).device_types() == device_types


def test_cephalo_models_cover_many_gpu_types() -> None:
    assert len(builtin_profiles("LLaMA-7B-s512").device_types()) >= 10
    assert len(builtin_profiles("GPT-2.7B-s512").device_types()) >= 8


def test_h100_profile_says_it_was_measured_on_the_nvl() -> None:
    (h100,) = [f for f in builtin_profiles("LLaMA-7B-s512").files if f.device_type == "H100"]
    assert "H100 NVL" in h100.source


def test_licences_and_readme_ship_with_the_data() -> None:
    for source in ("sailor", "cephalo"):
        assert "MIT License" in DATA.joinpath("profiles", source, "LICENSE").read_text()
    assert "Regenerate" in DATA.joinpath("profiles", "README.md").read_text()


def test_unknown_model_names_the_choices() -> None:
    with pytest.raises(SpecError, match="OPT-350"):
        builtin_model("OPT-1T")
    assert builtin_profiles("OPT-1T").files == ()

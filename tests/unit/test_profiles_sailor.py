"""Sailor importer: literal inputs with the arithmetic in comments, and the fixture excerpt."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.profiles.sailor import convert_sailor_profile, import_sailor
from orchestrator.spec.devices import Dtype

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sailor"

# A 1-block model: planner layers 0 (embedding), 1 (block), 2 (head).
RAW = {
    "1": {"1": {"0": [0.001, 0.0, 0.002], "1": [0.010, 0.020, 0.003], "2": [0.004, 0.005, 0.002]}},
    "2": {
        "1": {"0": [0.002, 0.0, 0.002], "1": [0.019, 0.039, 0.003], "2": [0.008, 0.010, 0.002]},
        "2": {"0": [0.002, 0.0, 0.001], "1": [0.011, 0.021, 0.0015], "2": [0.005, 0.006, 0.001]},
    },
}
LLM_INFO = {
    "1": {
        "0": {"params_floats": 1000, "act_mem_floats": 50},
        "1": {"params_floats": 300, "act_mem_floats": 700},
        "2": {"params_floats": 900, "act_mem_floats": 80},
    },
    # no tp 2: entries at tp 2 carry no memory
}


def convert(**kwargs):
    options = {"model": "m", "device_type": "A100-40", "source": "literal"}
    options.update(kwargs)
    return convert_sailor_profile(RAW, **options)


def test_times_are_copied_per_microbatch_and_tp() -> None:
    profile = convert()
    keys = [(e.microbatch_size, e.tp) for e in profile.entries]
    assert keys == [(1, 1), (2, 1), (2, 2)]  # sorted by (microbatch, tp)
    block = profile.entries[1].layers[1]  # mbs 2, tp 1, layer 1: [0.019, 0.039, 0.003]
    assert (block.forward_s, block.backward_s) == (0.019, 0.039)
    assert sorted(profile.entries[0].layers) == [0, 1, 2]


def test_update_is_kept_once_per_stage_not_per_layer() -> None:
    # Sailor's update_s is a stage's optimizer step, read at the stage's first layer: mbs 2, tp 1
    # holds 0.002 at layer 0, so the entry's stage update is 0.002 and every layer's own is 0.
    profile = convert()
    mbs2 = profile.entries[1]
    assert mbs2.stage_update_s == 0.002
    assert all(t.update_s == 0.0 for t in mbs2.layers.values())
    assert profile.entries[2].stage_update_s == 0.001  # mbs 2, tp 2: [.., .., 0.001] at layer 0


def test_update_of_zero_everywhere_means_not_measured() -> None:
    raw = {"1": {"1": {"0": [0.001, 0.0, 0.0], "1": [0.01, 0.02, 0.0], "2": [0.004, 0.005, 0.0]}}}
    profile = convert_sailor_profile(raw, model="m", device_type="A100-40", source="literal")
    entry = profile.entries[0]
    assert entry.stage_update_s is None
    assert all(t.update_s is None for t in entry.layers.values())  # the cost model estimates it


def test_parameters_are_floats_times_dtype_bytes_and_activations_are_left_to_the_formula() -> None:
    profile = convert(llm_info_model=LLM_INFO, dtype=Dtype.FP16)
    mbs1, mbs2, mbs2_tp2 = profile.entries
    # block: 300 params x 2 B = 600 B
    assert mbs1.layers[1].param_bytes == 600
    # act_mem_floats is not a fixed number of bytes per unit: no activation bytes are imported
    assert mbs1.layers[1].activation_bytes is None
    assert mbs2.layers[1].activation_bytes is None
    fp32 = convert(llm_info_model=LLM_INFO, dtype=Dtype.FP32)
    assert fp32.entries[1].layers[1].param_bytes == 1200  # 300 x 4 B
    assert fp32.dtype == "fp32"
    # llm_info has no tp 2: no memory figures there (the cost model estimates them)
    assert mbs2_tp2.layers[1].param_bytes is None


def test_without_llm_info_memory_is_absent_and_the_source_says_so() -> None:
    profile = convert()
    assert all(t.activation_bytes is None for e in profile.entries for t in e.layers.values())
    assert "no memory figures" in profile.source


def test_microbatch_filter_keeps_only_the_listed_sizes() -> None:
    profile = convert(microbatch_sizes=[2])
    assert {e.microbatch_size for e in profile.entries} == {2}
    with pytest.raises(SpecError, match="--microbatch-sizes"):
        convert(microbatch_sizes=[16])


def test_layer_count_is_checked_against_num_layers() -> None:
    assert convert(num_layers=1).entries  # 1 block + 2 = 3 planner layers: matches
    with pytest.raises(SpecError) as err:
        convert(num_layers=2)  # 2 blocks would be 4 planner layers, the profile has 3
    assert err.value.field == "--num-layers"
    assert "--num-layers 1" in str(err.value)


@pytest.mark.parametrize(
    "raw",
    [
        {"1": {"1": {"0": [0.1, 0.2]}}},  # two numbers, not three
        {"1": {"1": {"0": [0.1, -0.2, 0.0]}}},  # negative time
        {"x": {"1": {"0": [0.1, 0.2, 0.0]}}},  # microbatch key not an integer
        {"1": {"1": {"0": "fast"}}},
        {"1": ["not", "an", "object"]},
    ],
)
def test_malformed_source_is_one_spec_error(raw: object) -> None:
    with pytest.raises(SpecError):
        convert_sailor_profile(raw, model="m", device_type="A100-40", source="bad")


def test_import_fixture_maps_names_and_skips_unknown_gpus() -> None:
    result = import_sailor(FIXTURES, num_layers=2, sequence_length=2048)
    assert [(p.model, p.device_type) for p in result.profiles] == [
        ("TINY", "A100-40"),
        ("TINY", "V100-16"),
    ]
    assert any("XPU-9" in w for w in result.warnings)
    a100 = result.profiles[0]
    assert a100.sequence_length == 2048 and a100.dtype == "fp16"
    # OPT-350 block on A100-40, mbs 1, tp 1 (Sailor): forward 0.002786 s, backward 0.005906 s
    block = a100.entries[0].layers[1]
    assert (block.forward_s, block.backward_s) == (0.002786, 0.005906)
    # OPT-350 block: 12,596,224 params x 2 B; activations from the cost model's formula
    assert block.param_bytes == 12_596_224 * 2
    assert block.activation_bytes is None
    assert a100.entries[0].stage_update_s is not None


def test_import_fixture_renames_and_filters() -> None:
    result = import_sailor(FIXTURES, model="TINY", name="tiny-2", gpus=["V100-16"])
    assert [(p.model, p.device_type) for p in result.profiles] == [("tiny-2", "V100-16")]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"model": "OPT-999"}, "--model"),
        ({"gpus": ["A100-80"]}, "--gpus"),  # not in the source
        ({"gpus": ["XPU-9"]}, "--gpus"),  # in the source, but no catalog name
    ],
)
def test_import_fixture_bad_choices(kwargs: dict, field: str) -> None:
    with pytest.raises(SpecError) as err:
        import_sailor(FIXTURES, **kwargs)
    assert err.value.field == field


def test_source_without_profiles_folder(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="profiles/"):
        import_sailor(tmp_path)

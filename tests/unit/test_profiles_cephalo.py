"""Cephalo importer: the four entry shapes with the arithmetic in comments, and the fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.profiles.cephalo import convert_cephalo_entry, import_cephalo, layer_times_ms
from orchestrator.spec.devices import Dtype

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cephalo"

# fits: forward 2 ms/sample + 1 ms, backward 4 ms/sample + 3 ms; measured for batches 1 and 2
FULL = [[2.0, 1.0], [4.0, 3.0], [3.5, 5.5], [7.5, 11.0]]


def test_measured_batches_use_the_arrays_and_others_the_fit() -> None:
    assert layer_times_ms(FULL, 1, "x") == (3.5, 7.5, "measured")
    assert layer_times_ms(FULL, 2, "x") == (5.5, 11.0, "measured")
    # batch 4 was not measured: forward 2*4+1 = 9, backward 4*4+3 = 19
    assert layer_times_ms(FULL, 4, "x") == (9.0, 19.0, "fit")


def test_fits_only() -> None:
    # forward 2*8+1 = 17, backward 4*8+3 = 35
    assert layer_times_ms(FULL[:2], 8, "x") == (17.0, 35.0, "fit")


def test_combined_fit_is_split_one_third_forward() -> None:
    # forward+backward = 6*2 + 3 = 15 ms: 5 forward, 10 backward
    fwd, bwd, how = layer_times_ms([6.0, 3.0], 2, "x")
    assert (fwd, bwd, how) == pytest.approx((5.0, 10.0, "combined fit"))


def test_combined_slope_without_intercept() -> None:
    # 3 ms per sample x 4 = 12 ms: 4 forward, 8 backward
    fwd, bwd, _ = layer_times_ms(3.0, 4, "x")
    assert (fwd, bwd) == pytest.approx((4.0, 8.0))


def test_non_positive_fit_is_not_used() -> None:
    # forward 5*1 - 6 = -1 ms at batch 1: unusable; at batch 2, 5*2 - 6 = 4 ms
    entry = [[5.0, -6.0], [10.0, 0.0]]
    assert layer_times_ms(entry, 1, "x") is None
    assert layer_times_ms(entry, 2, "x") == (4.0, 20.0, "fit")
    profile, skipped = convert_cephalo_entry(
        entry,
        model="m",
        device_type="T4",
        source="s",
        num_layers=2,
        sequence_length=512,
        dtype=Dtype.FP16,
        microbatch_sizes=[1, 2],
    )
    assert skipped == [1]
    assert profile is not None and [e.microbatch_size for e in profile.entries] == [2]


@pytest.mark.parametrize("entry", ["fast", [1.0], [[1.0, 2.0]], [[1.0], [2.0]], {"a": 1}])
def test_unrecognised_entries_are_spec_errors(entry: object) -> None:
    with pytest.raises(SpecError):
        layer_times_ms(entry, 1, "where")


def test_blocks_get_the_layer_and_embedding_and_head_are_absent() -> None:
    profile, _ = convert_cephalo_entry(
        FULL,
        model="m",
        device_type="A6000",
        source="s",
        num_layers=3,
        sequence_length=512,
        dtype=Dtype.FP32,
        microbatch_sizes=[2, 1, 2],
    )
    assert profile is not None
    assert [e.microbatch_size for e in profile.entries] == [1, 2]  # sorted, deduplicated
    layers = profile.entries[1].layers
    assert sorted(layers) == [1, 2, 3]  # 0 (embedding) and 4 (head) left to the cost model
    # 5.5 ms and 11.0 ms in seconds
    assert layers[2].forward_s == pytest.approx(0.0055)
    assert layers[2].backward_s == pytest.approx(0.011)
    assert layers[2].update_s is None and "update not measured" in profile.source


def test_import_fixture() -> None:
    result = import_cephalo(FIXTURES, model="tinygpt", sequence_length=512, dtype=Dtype.FP32)
    by_type = {p.device_type: p for p in result.profiles}
    # a100x40, h100-nvl, v100x16, l4, rtx3090, a10g map; p100 (no catalog entry), mi250
    # (unknown), t4 (fp16 only) and v100-pciex16 (V100-16 taken by v100x16) are skipped.
    assert sorted(by_type) == ["A100-40", "A10G", "H100", "L4", "RTX-3090", "V100-16"]
    text = " | ".join(result.warnings)
    for skipped in ("p100", "mi250", "t4", "v100-pciex16"):
        assert skipped in text
    assert "H100 NVL" in by_type["H100"].source
    assert "v100x16" in by_type["V100-16"].source
    # num_layers from model_stats.json beside the latencies: 3 blocks
    assert sorted(by_type["A100-40"].entries[0].layers) == [1, 2, 3]
    # deepspeedllama_7b on a100x40, fp32, batch 1: 13.235306... ms forward (measured)
    a100 = by_type["A100-40"].entries[0].layers[1]
    assert a100.forward_s == pytest.approx(13.235306333333332e-3)
    assert all(p.model == "tinygpt" and p.sequence_length == 512 for p in result.profiles)


def test_import_fixture_with_name_gpus_and_sizes() -> None:
    result = import_cephalo(
        FIXTURES / "model_latencies.json",
        model="tinygpt",
        name="Tiny",
        sequence_length=512,
        dtype=Dtype.FP16,
        gpus=["t4"],
        num_layers=5,
        microbatch_sizes=[1, 8],
    )
    (t4,) = result.profiles
    assert (t4.model, t4.device_type, t4.dtype) == ("Tiny", "T4", "fp16")
    assert sorted(t4.entries[0].layers) == [1, 2, 3, 4, 5]
    # batch 8 is beyond the 4 measured: fit 9.692664... * 8 - 9.122209... ms forward
    expected_ms = 9.692664295784311 * 8 - 9.122209468333303
    assert t4.entries[1].layers[1].forward_s == pytest.approx(expected_ms * 1e-3)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"model": "gpt-9"}, "--model"),
        ({"gpus": ["mi250"]}, "--gpus"),  # in the source, no catalog name
        ({"gpus": ["a100x80"]}, "--gpus"),  # not in the source
        ({"gpus": ["t4"]}, "--gpus"),  # no fp32 measurement for it
        ({"sequence_length": 2048}, "--sequence-length/--dtype"),
    ],
)
def test_import_bad_choices(kwargs: dict, field: str) -> None:
    options = {"model": "tinygpt", "sequence_length": 512, "dtype": Dtype.FP32}
    options.update(kwargs)
    with pytest.raises(SpecError) as err:
        import_cephalo(FIXTURES, **options)
    assert err.value.field == field


def test_unknown_layer_count_without_model_stats(tmp_path: Path) -> None:
    (tmp_path / "model_latencies.json").write_text((FIXTURES / "model_latencies.json").read_text())
    with pytest.raises(SpecError) as err:
        import_cephalo(tmp_path, model="tinygpt", sequence_length=512, dtype=Dtype.FP32)
    assert err.value.field == "--num-layers"

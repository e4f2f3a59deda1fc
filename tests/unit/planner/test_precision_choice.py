"""A job's precision: the format every planned device type runs fast, said in the plan output."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cli.main import main
from orchestrator.planner.precision import choose_precision, fast_formats, precision_note
from orchestrator.spec.devices import DeviceCatalog, Dtype

CATALOG = DeviceCatalog.builtin()


def _types(*names: str):  # type: ignore[no-untyped-def]
    return [CATALOG[n] for n in names]


def test_catalog_rates_give_the_fast_formats_frameworks_reach() -> None:
    assert fast_formats(CATALOG["A100-80"]) == {Dtype.BF16, Dtype.FP16}
    assert fast_formats(CATALOG["H200"]) == {Dtype.BF16, Dtype.FP16}
    for name in ("T4", "V100-32", "V100-16"):
        assert fast_formats(CATALOG[name]) == {Dtype.FP16}, name
    # The P40's fp16 runs at about its fp32 rate in PyTorch: no fast format at all.
    assert fast_formats(CATALOG["P40"]) == frozenset()
    assert CATALOG["P40"].flops_per_s(Dtype.FP16) == CATALOG["P40"].flops_per_s(Dtype.FP32)


def test_choice_takes_bf16_then_fp16_then_fp32_and_says_why() -> None:
    assert choose_precision(_types("A100-80", "H100")).precision is Dtype.BF16
    mixed = choose_precision(_types("A100-80", "T4"))
    assert mixed.precision is Dtype.FP16 and "T4" in mixed.reason and "bf16" in mixed.reason
    old = choose_precision(_types("A100-80", "P40"))
    assert old.precision is Dtype.FP32 and "P40" in old.reason


def test_note_warns_only_where_the_planned_format_is_slow() -> None:
    assert precision_note(Dtype.BF16, _types("A100-80", "H100")) is None
    assert precision_note(Dtype.FP32, _types("T4")) is None
    note = precision_note(Dtype.BF16, _types("A100-80", "T4"))
    assert note is not None and "T4" in note and "fp16" in note


def _plan_json(tmp_path: Path, device_type: str, capsys) -> dict:  # type: ignore[no-untyped-def, type-arg]
    cluster = tmp_path / f"{device_type}.yaml"
    cluster.write_text(
        f"node_groups:\n  - {{name: g, device_type: {device_type}, num_nodes: 1, "
        "devices_per_node: 2}\n"
    )
    model = tmp_path / "model.yaml"
    model.write_text(
        "name: small\nnum_layers: 4\nhidden_size: 256\nnum_heads: 4\nsequence_length: 128\n"
        "vocab_size: 1000\ndtype: bf16\n"
    )
    capsys.readouterr()
    assert main(["plan", "--cluster", str(cluster), "--model", str(model), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_plan_output_names_the_precision_and_why(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    on_t4 = _plan_json(tmp_path, "T4", capsys)["precision"]
    assert on_t4["planned"] == "bf16" and on_t4["suits_every_type"] == "fp16"
    assert "T4" in on_t4["warning"] and "bf16" in on_t4["reason"]
    on_a100 = _plan_json(tmp_path, "A100-80", capsys)["precision"]
    assert on_a100["suits_every_type"] == "bf16" and on_a100["warning"] is None

"""Layer-indexed checkpoints: atomic publication, corruption detection, resume on a new plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_cases import engine_config, layer_relative_errors, make_plan, reference_params

from orchestrator.worker import checkpoint as ckpt
from orchestrator.worker.local import run_local


def fake_states(num_layers: int, seed: int) -> dict[int, dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    return {
        i: {
            "params": {"weight": torch.randn(4, 3, generator=g)},
            "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": []},
        }
        for i in range(num_layers)
    }


PLAN = make_plan([(4, [((0, 2), "A100"), ((2, 5), "A100")])])


def test_round_trip_with_manifest(tmp_path: Path) -> None:
    states = fake_states(5, seed=1)
    path = ckpt.save_checkpoint(tmp_path, 7, states, PLAN)
    assert path.name == "step-00000007"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 7
    assert manifest["plan"]["replicas"][0]["batch_size"] == 4
    assert sorted(manifest["files"]) == [f"layer-{i:04d}.pt" for i in range(5)]
    assert all(len(d) == 64 for d in manifest["files"].values())  # sha256 hex

    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None
    assert loaded.step == 7 and loaded.plan == PLAN and loaded.skipped == ()
    for i in range(5):
        got = loaded.layer_states[i]["params"]["weight"]
        assert torch.equal(got, states[i]["params"]["weight"])


def test_corrupt_newest_falls_back_to_previous_good(tmp_path: Path) -> None:
    ckpt.save_checkpoint(tmp_path, 1, fake_states(5, seed=1))
    newest = ckpt.save_checkpoint(tmp_path, 2, fake_states(5, seed=2))
    layer = newest / "layer-0003.pt"
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip one byte
    layer.write_bytes(bytes(data))

    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None and loaded.step == 1
    assert len(loaded.skipped) == 1
    assert "layer-0003.pt fails its sha256 checksum" in loaded.skipped[0].reason


def test_partial_checkpoint_without_manifest_is_skipped(tmp_path: Path) -> None:
    ckpt.save_checkpoint(tmp_path, 1, fake_states(5, seed=1))
    partial = tmp_path / "step-00000002"  # e.g. copied in by hand and cut short
    partial.mkdir()
    (partial / "layer-0000.pt").write_bytes(b"truncated")

    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None and loaded.step == 1
    assert "no manifest.json (partial checkpoint)" in loaded.skipped[0].reason


def test_missing_layer_file_is_detected(tmp_path: Path) -> None:
    ckpt.save_checkpoint(tmp_path, 1, fake_states(5, seed=1))
    (tmp_path / "step-00000001" / "layer-0004.pt").unlink()
    with pytest.raises(ckpt.CheckpointError, match=r"layer-0004\.pt is missing"):
        ckpt.load_latest(tmp_path)


def test_empty_root_has_no_checkpoint(tmp_path: Path) -> None:
    assert ckpt.load_latest(tmp_path / "none") is None


def test_failed_write_publishes_nothing_and_keeps_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt.save_checkpoint(tmp_path, 3, fake_states(5, seed=1))
    real_save = torch.save
    calls = {"n": 0}

    def failing_save(obj: Any, f: Any) -> None:
        calls["n"] += 1
        if calls["n"] >= 3:
            raise OSError("disk full")
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path, 3, fake_states(5, seed=2))  # re-save of the same step
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path, 4, fake_states(5, seed=2))
    monkeypatch.undo()

    assert [p.name for p in tmp_path.iterdir()] == ["step-00000003"]  # no temp left behind
    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None and loaded.step == 3
    original = fake_states(5, seed=1)
    assert torch.equal(loaded.layer_states[2]["params"]["weight"], original[2]["params"]["weight"])


def test_resave_replaces_whole_checkpoint(tmp_path: Path) -> None:
    ckpt.save_checkpoint(tmp_path, 3, fake_states(5, seed=1))
    ckpt.save_checkpoint(tmp_path, 3, fake_states(5, seed=2))
    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None
    new = fake_states(5, seed=2)
    assert all(
        torch.equal(loaded.layer_states[i]["params"]["weight"], new[i]["params"]["weight"])
        for i in range(5)
    )
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000003"]


def test_keep_last_prunes_older(tmp_path: Path) -> None:
    for step in range(1, 6):
        ckpt.save_checkpoint(tmp_path, step, fake_states(2, seed=step), keep_last=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000005", "step-00000004"]


def test_commit_refuses_missing_layers(tmp_path: Path) -> None:
    staging = ckpt.begin_checkpoint(tmp_path, 9)
    ckpt.write_layers(staging, {0: fake_states(1, seed=0)[0]})
    with pytest.raises(ckpt.CheckpointError, match=r"lacks layer files \[1, 2\]"):
        ckpt.commit_checkpoint(tmp_path, staging, 9, None, num_layers=3)
    assert ckpt.list_checkpoints(tmp_path) == []


def test_resume_with_different_stage_boundaries(tmp_path: Path) -> None:
    """Train 2 steps on plan A, checkpoint, resume 2 steps on plan B (other cuts, other shares):
    the result equals 4 uninterrupted single-process steps, and loading is exact."""
    plan_a = make_plan([(8, [((0, 2), "A100"), ((2, 5), "A100")])])
    plan_b = make_plan(
        [(5, [((0, 4), "A100"), ((4, 5), "A100")]), (3, [((0, 1), "A100"), ((1, 5), "A100")])]
    )
    first = run_local(engine_config(plan_a), range(2))
    ckpt.save_checkpoint(tmp_path, 2, first.layer_states, plan_a)

    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None and loaded.step == 2 and loaded.plan == plan_a
    second = run_local(engine_config(plan_b), range(2, 4), initial_states=loaded.layer_states)

    ref_params, _ = reference_params(plan_b, 4, "adam")  # same global batch of 8 samples
    errors = layer_relative_errors(second.layer_states, ref_params)
    assert max(errors.values()) <= 1e-5, errors
    # Adam's state came along: its step count is 4 on every layer.
    for state in second.layer_states.values():
        steps = {float(s["step"]) for s in state["optimizer"]["state"].values()}
        assert steps == {4.0}


def test_loading_into_a_new_plan_is_bit_exact(tmp_path: Path) -> None:
    plan_a = make_plan([(4, [((0, 5), "A100")])])
    plan_b = make_plan([(2, [((0, 3), "A100"), ((3, 5), "A100")]), (2, [((0, 5), "A100")])])
    first = run_local(engine_config(plan_a), range(1))
    ckpt.save_checkpoint(tmp_path, 1, first.layer_states, plan_a)
    loaded = ckpt.load_latest(tmp_path)
    assert loaded is not None
    resumed = run_local(engine_config(plan_b), range(0), initial_states=loaded.layer_states)
    for layer, state in first.layer_states.items():
        for name, tensor in state["params"].items():
            assert torch.equal(resumed.layer_states[layer]["params"][name], tensor), (layer, name)

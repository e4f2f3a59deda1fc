"""The fine-tuning example end to end: prepare the shipped corpus as a token file, train the
tiny Llama of examples/finetune-llama on a fixed two-stage plan of the test cluster, export,
and load the export with ``from_pretrained``: its logits are the checkpoint's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ray_plans import plan

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "finetune-llama"
CLI = [sys.executable, "-m", "orchestrator.cli.main"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_finetune_example_trains_and_exports(ray_cluster: object, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from orchestrator.models.hf_causal import HFCausalLM
    from orchestrator.worker.checkpoint import load_latest

    work = tmp_path / "example"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("train.bin*", "checkpoints"))
    prepared = _cli("data", "prepare", "--out", str(work / "train.bin"), "--no-progress")
    assert prepared.returncode == 0, prepared.stderr[-3000:]

    job = yaml.safe_load((work / "job.yaml").read_text())
    # 6 planner layers (4 blocks) on two stages of different device types; few steps.
    (work / "plan.json").write_text(plan((8, [(0, 3, "A100-80"), (3, 6, "L4")])).to_json())
    job["plan"] = "plan.json"
    job["training"]["steps"] = 3
    job["checkpoint"]["interval_steps"] = 0
    (work / "job.yaml").write_text(yaml.safe_dump(job))
    address = ray_cluster.address  # type: ignore[attr-defined]
    run = _cli("run", str(work / "job.yaml"), "--address", address)
    assert run.returncode == 0, run.stderr[-3000:]
    steps = [line for line in run.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 3, run.stdout

    exported = _cli("export", str(work / "job.yaml"), "--out", str(tmp_path / "trained"))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "exported step 3" in exported.stdout

    checkpoint = load_latest(work / "checkpoints")
    assert checkpoint is not None and checkpoint.step == 3
    model = HFCausalLM(work / "tiny-llama", 64)
    layers = {}
    for i, state in checkpoint.layer_states.items():
        layers[i] = model.build_layer(i)
        layers[i].load_state_dict(state["params"])
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "trained").eval()
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = ids
        for i in range(model.num_planner_layers):
            out = layers[i](out)
        assert torch.allclose(loaded(input_ids=ids).logits, out, atol=1e-5)


@pytest.mark.slow
def test_own_model_from_a_local_file_runs_as_a_ray_job(tmp_path: Path) -> None:
    """examples/own-model: `ray job submit --working-dir .` from the example's folder; the module
    is imported from the uploaded working dir on the driver and on every worker."""
    from ray_head import ray_head, snapshot_repo
    from test_job_submit import losses, submit

    from orchestrator.runtime.local_nodes import FAST_HEALTH_CHECKS

    repo = snapshot_repo(EXAMPLE.parents[1], tmp_path / "repo")
    folder = repo / "examples" / "own-model"
    with ray_head(2, {"orchestrator.io/device-type": "cpu"}, FAST_HEALTH_CHECKS) as head:
        env = {**head.env, "PYTHONPATH": str(repo)}
        output = submit(head.dashboard_url, env, folder, "job.yaml", tmp_path / "checkpoints")
    got = losses(output)
    assert len(got) == 30, output[-3000:]
    assert sum(got[-5:]) / 5 < sum(got[:5]) / 5 - 0.5, got

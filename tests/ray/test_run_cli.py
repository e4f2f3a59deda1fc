"""``orchestrator run`` refuses bad jobs with one line and exit code 2, before any actor starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ray_plans import MODEL_KWARGS, plan

JOB = {
    "name": "bad-input",
    "model": {
        "factory": "orchestrator.models.gpt:make_gpt",
        "shape": {"name": "gpt-test", "vocab_size": 256, "dtype": "fp32", **MODEL_KWARGS},
    },
    "data": {},
    "training": {"global_batch_size": 4, "microbatch_sizes": [2], "steps": 2},
    "metrics": {"port": None},
}


def run_cli(tmp_path: Path, address: str, changes: dict, plan_json: str | None) -> tuple[int, str]:
    job = {**JOB, **changes}
    if plan_json is not None:
        (tmp_path / "plan.json").write_text(plan_json)
        job["plan"] = "plan.json"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    cli = [sys.executable, "-m", "orchestrator.cli.main", "run", str(tmp_path / "job.yaml")]
    proc = subprocess.run(
        [*cli, "--address", address],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(
    ("changes", "plan_json", "message"),
    [
        ({}, plan((4, [(0, 6, "H100")])).to_json(), "plan needs 1 H100 devices, the cluster has 0"),
        ({}, plan((4, [(0, 2, "L4"), (2, 6, "L4"), (6, 7, "L4")])).to_json(), "7 planner layers"),
        (
            {"model": {**JOB["model"], "factory": "missing_module:make"}},
            None,
            "cannot import module 'missing_module'",
        ),
        ({"training": {**JOB["training"], "steps": 0}}, None, "training.steps"),
    ],
    ids=["missing-device-type", "layer-count", "factory", "bad-field"],
)
def test_bad_job_is_one_line_and_exit_2(
    ray_cluster: object, tmp_path: Path, changes: dict, plan_json: str | None, message: str
) -> None:
    address = ray_cluster.address  # type: ignore[attr-defined]
    code, stderr = run_cli(tmp_path, address, changes, plan_json)
    lines = [line for line in stderr.splitlines() if line.startswith("orchestrator run: error:")]
    assert code == 2, stderr[-3000:]
    assert len(lines) == 1 and message in lines[0], stderr[-3000:]
    assert "Traceback" not in stderr


def test_fixed_plan_run_on_emulated_nodes_says_emulated(
    ray_cluster: object, tmp_path: Path
) -> None:
    """A fixed-plan job trains, checkpoints, and every step line says "emulated"; a corrupt
    newest checkpoint is reported and the previous good one resumed."""
    address = ray_cluster.address  # type: ignore[attr-defined]
    fixed = plan((3, [(0, 2, "A100-80"), (2, 6, "L4")]), (1, [(0, 6, "A100-80")]))
    changes = {"checkpoint": {"dir": str(tmp_path / "ckpt"), "interval_steps": 1}}
    (tmp_path / "plan.json").write_text(fixed.to_json())
    job = {**JOB, **changes, "plan": "plan.json"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    cli = [sys.executable, "-m", "orchestrator.cli.main", "run", str(tmp_path / "job.yaml")]
    proc = subprocess.run([*cli, "--address", address], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all(line.endswith("(emulated)") for line in steps), proc.stdout
    assert "emulated speeds on A100-80, L4" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "step-00000001",
        "step-00000002",
    ]
    # Corrupt the newest checkpoint: the next run says so and resumes from the previous one.
    layer_file = tmp_path / "ckpt" / "step-00000002" / "layer-0003.pt"
    layer_file.write_bytes(layer_file.read_bytes()[:-8] + b"garbage!")
    # A fixed-plan run serves metrics and /v1/status like any other (one run path).
    args = [*cli, "--address", address, "--steps", "3", "--metrics-port", "0"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "metrics: http://" in proc.stdout, proc.stdout
    assert "step-00000002 skipped:" in proc.stdout and "checksum" in proc.stdout, proc.stdout
    assert "resuming from the checkpoint at step 1" in proc.stdout, proc.stdout
    steps = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["2/3", "3/3"], proc.stdout


def test_profile_command_writes_emulated_profiles(ray_cluster: object, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(JOB))
    cli = [sys.executable, "-m", "orchestrator.cli.main", "profile", str(tmp_path / "job.yaml")]
    where = ["--address", ray_cluster.address]  # type: ignore[attr-defined]
    proc = subprocess.run(
        [*cli, "--out", str(tmp_path / "profiles"), "--cache", str(tmp_path / "cache"), *where],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "A100-80: measured, emulated x1" in proc.stdout
    assert "L4: measured, emulated x2" in proc.stdout
    files = sorted(p.name for p in (tmp_path / "profiles" / "gpt-test").iterdir())
    assert files == ["A100-80.json", "L4.json"]

"""Where `run` puts checkpoints: printed, and outside Ray's short-lived working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli.run_checks import describe_checkpoints, stable_checkpoints
from orchestrator.spec.job import DEFAULT_CHECKPOINT_INTERVAL_STEPS, JobSpec

JOB = {
    "name": "j",
    "model": {
        "factory": "orchestrator.models.gpt:make_gpt",
        "shape": {
            "name": "g",
            "num_layers": 2,
            "hidden_size": 32,
            "num_heads": 2,
            "sequence_length": 16,
            "vocab_size": 256,
        },
    },
    "data": {},
}


def test_relative_dir_in_ray_working_dir_moves_to_a_stable_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unpacked = tmp_path / "session_x" / "runtime_resources" / "working_dir_files" / "_ray_pkg_1"
    unpacked.mkdir(parents=True)
    job_file = unpacked / "job.yaml"
    job = JobSpec.model_validate({**JOB, "checkpoint": {"dir": "ckpt"}})
    monkeypatch.setenv("ORCHESTRATOR_CHECKPOINT_ROOT", str(tmp_path / "keep"))
    moved = stable_checkpoints(job, job_file)
    assert moved.checkpoint is not None
    assert moved.checkpoint.dir == str((tmp_path / "keep" / "j" / "ckpt").resolve())
    line = describe_checkpoints(moved, job_file)
    assert line == (
        f"checkpoints: {(tmp_path / 'keep' / 'j' / 'ckpt').resolve()} "
        f"(every {DEFAULT_CHECKPOINT_INTERVAL_STEPS} steps and at the end)"
    )


def test_elsewhere_relative_dirs_stay_beside_the_job_file(tmp_path: Path) -> None:
    job = JobSpec.model_validate({**JOB, "checkpoint": {"dir": "ckpt", "interval_steps": 0}})
    job_file = tmp_path / "job.yaml"
    assert stable_checkpoints(job, job_file) is job
    assert describe_checkpoints(job, job_file) == (
        f"checkpoints: {(tmp_path / 'ckpt').resolve()} (at the end)"
    )


def test_without_a_checkpoint_section() -> None:
    job = JobSpec.model_validate(JOB)
    # Fixed-plan and elastic runs alike go through the controller, which snapshots in memory.
    assert "in memory only, every 50 steps" in describe_checkpoints(job, Path("j.yaml"))

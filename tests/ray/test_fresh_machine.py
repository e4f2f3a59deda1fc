"""The demo's local cluster and the commands work on a fresh machine and beside another cluster.

Each test runs a script in a subprocess whose environment is close to a new user's: ``TMPDIR``
a new empty folder (so no ``$TMPDIR/ray``), ``HOME`` a path where nothing can be created, nothing
else from this environment but ``PATH`` and ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from ray_plans import MODEL_KWARGS, plan

HERE = Path(__file__).parent
JOB = {
    "name": "fresh-machine",
    "model": {
        "factory": "orchestrator.models.gpt:make_gpt",
        "shape": {"name": "gpt-test", "vocab_size": 256, "dtype": "fp32", **MODEL_KWARGS},
    },
    "data": {},
    "training": {"global_batch_size": 4, "microbatch_sizes": [2], "steps": 2},
    "metrics": {"port": None},
}


@pytest.fixture
def fresh_tmpdir() -> Iterator[Path]:
    """A new empty folder, short enough for Ray's socket paths to live under it."""
    path = Path(tempfile.mkdtemp(prefix="fresh", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _fresh_env(tmp_path: Path, temp: Path, **extra: str) -> dict[str, str]:
    # A HOME where nothing can be created, even by root (which ignores permission bits): a file.
    home = tmp_path / "home"
    home.write_text("")
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "HOME": str(home),
        "TMPDIR": str(temp),
        **extra,
    }


def _run_script(tmp_path: Path, env: dict[str, str], *args: str) -> dict:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "fresh_machine.py"), str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_profile_and_run_with_fresh_tmpdir_and_read_only_home(
    tmp_path: Path, fresh_tmpdir: Path
) -> None:
    (tmp_path / "job").mkdir()
    job_file = tmp_path / "job" / "job.yaml"
    job_file.write_text(yaml.safe_dump(JOB))
    plan_file = tmp_path / "job" / "plan.json"
    plan_file.write_text(plan((4, [(0, 6, "A100-80")])).to_json())
    env = _fresh_env(tmp_path, fresh_tmpdir)
    result = _run_script(tmp_path, env, str(job_file), str(plan_file))
    assert result["started"]
    assert result["temp_dir"].startswith(str(fresh_tmpdir))  # TMPDIR honoured
    assert result["ray_tmpdir_during"] == result["temp_dir"]
    assert result["ray_tmpdir_after"] is None  # the caller's environment is restored
    profile = result["profile"]
    assert profile["rc"] == 0, profile["stderr"][-3000:]
    assert "is not writable; caching profiles in" in profile["stderr"]
    assert "A100-80: measured" in profile["stdout"]
    run = result["run"]
    assert run["rc"] == 0, run["stderr"][-3000:]
    assert [ln.split()[1] for ln in run["stdout"].splitlines() if ln.startswith("step ")] == [
        "1/2",
        "2/2",
    ]
    assert "Traceback" not in run["stderr"] + profile["stderr"]
    assert result["left_running"] == []
    assert not result["temp_dir_left"]


def test_local_cluster_beside_another_cluster_keeps_its_address_file(
    tmp_path: Path, fresh_tmpdir: Path
) -> None:
    """Another cluster's address file (under RAY_TMPDIR) is neither used nor changed nor deleted."""
    other = tmp_path / "other"
    (other / "ray").mkdir(parents=True)
    address_file = other / "ray" / "ray_current_cluster"
    address_file.write_text("10.9.8.7:6379")
    env = _fresh_env(tmp_path, fresh_tmpdir, RAY_TMPDIR=str(other), RAY_ADDRESS="10.9.8.7:6379")
    result = _run_script(tmp_path, env)
    assert result["started"]
    assert not result["temp_dir"].startswith(str(other))
    assert address_file.read_text() == "10.9.8.7:6379"
    assert result["ray_tmpdir_after"] == str(other)
    assert result["left_running"] == []


def test_failed_start_stops_every_process_it_started(tmp_path: Path, fresh_tmpdir: Path) -> None:
    result = _run_script(tmp_path, _fresh_env(tmp_path, fresh_tmpdir), "--fail-start")
    assert result["start_error"]  # the head started, the second node did not
    assert result["left_after_failed_start"] == []
    assert result["left_running"] == []
    assert result["ray_tmpdir_after"] is None

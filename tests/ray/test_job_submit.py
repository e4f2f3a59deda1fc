"""Integration: ``ray job submit --working-dir . -- orchestrator run examples/<job>.yaml``.

Against a real ``ray start --head`` (free ports, stopped by process id at the end), each example
job must succeed and its loss must fall. The pipeline example checkpoints every 10 steps.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from ray_head import ray_head, snapshot_repo

from orchestrator.runtime.local_nodes import FAST_HEALTH_CHECKS

REPO = Path(__file__).resolve().parents[2]
STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss ([0-9.]+) ", re.MULTILINE)


def submit(
    head_url: str, env: dict[str, str], cwd: Path, job: str, checkpoint_root: Path
) -> str:
    # The job's own checkpoint root: a relative checkpoint folder of a submitted job lives under
    # it (docs/job.md), and a leftover from an earlier run would be resumed instead of trained.
    runtime_env = json.dumps({"env_vars": {"ORCHESTRATOR_CHECKPOINT_ROOT": str(checkpoint_root)}})
    cmd = [
        "ray", "job", "submit", "--address", head_url, "--working-dir", ".",
        "--runtime-env-json", runtime_env,
        "--", "orchestrator", "run", job,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "succeeded" in output, output[-4000:]
    return output


def losses(output: str) -> list[float]:
    return [float(m.group(3)) for m in STEP_LINE.finditer(output)]


@pytest.mark.slow
def test_examples_run_as_ray_jobs(tmp_path: Path) -> None:
    work = snapshot_repo(REPO, tmp_path / "repo")
    with ray_head(2, {"orchestrator.io/device-type": "cpu"}, FAST_HEALTH_CHECKS) as head:
        root = tmp_path / "checkpoints"
        planned = submit(head.dashboard_url, head.env, work, "examples/gpt-tiny.yaml", root)
        fixed = submit(head.dashboard_url, head.env, work, "examples/gpt-tiny-pipeline.yaml", root)
    for output, steps in ((planned, 40), (fixed, 30)):
        got = losses(output)
        assert len(got) == steps, output[-3000:]
        first, last = sum(got[:5]) / 5, sum(got[-5:]) / 5
        assert last < first - 1.0, (
            f"loss did not fall: first five {first:.3f}, last five {last:.3f}"
        )
    assert "plan (planner)" in planned
    assert "plan (file " in fixed
    # The controller's checkpoint events: every 10 steps, and at the end.
    assert "checkpoint saved at step 10" in fixed and "checkpoint saved at step 30" in fixed

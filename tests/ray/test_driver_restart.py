"""A killed driver is restarted: the run resumes from its latest checkpoint and run state.

``orchestrator run`` runs as a real process against the session's Ray cluster; it is SIGKILLed
once it has saved a checkpoint, and the same command is run again. The second run must say it
resumes from that checkpoint, finish, and run every step after the checkpoint with exactly the
loss an uninterrupted run has at that step (the same data order and the same restored state).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

JOB = """
name: driver-restart
model:
  factory: orchestrator.models.gpt:make_gpt
  shape: {name: gpt-restart, num_layers: 2, hidden_size: 32, num_heads: 2, sequence_length: 16,
          vocab_size: 256, dtype: fp32}
data: {}
training: {global_batch_size: 8, microbatch_sizes: [4], mixed_precision: false, steps: 120,
           learning_rate: 0.003, optimizer: adam, seed: 0}
checkpoint: {dir: ckpt, interval_steps: 4}
metrics: {port: null}
"""
STEPS = 120  # enough that the first run is still training when it is killed
STEP_LINE = re.compile(r"^step (\d+)/\d+ loss ([0-9.]+)", re.M)


def _losses(text: str) -> dict[int, str]:
    return {int(step): loss for step, loss in STEP_LINE.findall(text)}


@pytest.mark.slow
def test_a_restarted_driver_resumes_from_the_checkpoint(ray_cluster, tmp_path: Path) -> None:
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.address, PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "orchestrator.cli.main", "run", "job.yaml"]
    uninterrupted = tmp_path / "uninterrupted"
    uninterrupted.mkdir()
    (uninterrupted / "job.yaml").write_text(JOB)
    reference = subprocess.run(
        command, cwd=uninterrupted, env=env, capture_output=True, text=True, timeout=300
    )
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]
    expected = _losses(reference.stdout)
    assert sorted(expected) == list(range(1, STEPS + 1))

    (tmp_path / "job.yaml").write_text(JOB)
    first_log = tmp_path / "first.log"
    with first_log.open("w") as log:
        first = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 240
        try:
            while "checkpoint saved at step 8" not in first_log.read_text():
                assert first.poll() is None, first_log.read_text()[-2000:]
                assert time.monotonic() < deadline, "no checkpoint at step 8 in time"
                time.sleep(0.05)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
    first_text = first_log.read_text()

    second = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    resumed = re.search(r"resuming from the checkpoint at step (\d+)", second.stdout)
    assert resumed, second.stdout[-2000:]
    checkpoint_step = int(resumed[1])
    assert checkpoint_step >= 8
    assert f"finished {STEPS} steps" in second.stdout
    before, after = _losses(first_text), _losses(second.stdout)
    assert max(before) < STEPS  # the first run was really cut short
    assert min(after) == checkpoint_step + 1  # nothing before the checkpoint is run again
    assert max(after) == STEPS
    assert {s: after[s] for s in after} == {s: expected[s] for s in after}

"""``orchestrator run`` with ``training.eval_every`` on a real Ray cluster prints the validation
loss measured through a pipelined plan with two replicas."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from ray_plans import MODEL_KWARGS, plan


@pytest.mark.slow  # ~45 s on a busy 2-core machine, most of it the cluster and the actors
def test_run_prints_the_validation_loss(ray_cluster: object, tmp_path: Path) -> None:
    address = ray_cluster.address  # type: ignore[attr-defined]
    seq = MODEL_KWARGS["sequence_length"]
    np.random.default_rng(0).integers(0, 256, 40 * seq + 1).astype(np.uint16).tofile(
        tmp_path / "train.bin"
    )
    (tmp_path / "plan.json").write_text(
        plan((5, [(0, 2, "A100-80"), (2, 6, "A100-80")]), (3, [(0, 6, "A100-80")])).to_json()
    )
    job = {
        "name": "evaluated",
        "model": {
            "factory": "orchestrator.models.gpt:make_gpt",
            "shape": {"name": "gpt-test", "vocab_size": 256, "dtype": "fp32", **MODEL_KWARGS},
        },
        "data": {"tokens": "train.bin", "validation_fraction": 0.25},
        "training": {
            "global_batch_size": 8,
            "microbatch_sizes": [2],
            "steps": 3,
            "eval_every": 1,
            "eval_batches": 1,
        },
        "metrics": {"port": None},
        "plan": "plan.json",
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    cli = [sys.executable, "-m", "orchestrator.cli.main", "run", str(tmp_path / "job.yaml")]
    proc = subprocess.run([*cli, "--address", address], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evals = [line.split() for line in proc.stdout.splitlines() if line.startswith("eval loss ")]
    # After steps 1 and 2; the weights after the last step are not evaluated on this runtime.
    assert [words[-1] for words in evals] == ["1", "2"], proc.stdout
    losses = [float(words[2]) for words in evals]
    # Random tokens: near ln 256 (uniform), finite, and both replicas' shares summed (not half).
    assert all(math.isfinite(x) and 4.5 < x < 7.0 for x in losses), proc.stdout

"""examples/hf-dataset: a saved Hugging Face dataset and a local tokenizer made offline by the
example's script, tokenized once when the job is checked, then a two-stage plan of real gloo ranks
trains the example's tiny Llama on it and the loss falls; the ranks read the cached token file and
never tokenize again."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dist_cases import make_plan

from orchestrator.runtime.jobs import load_job, optimizer_recipe, worker_job
from orchestrator.runtime.validation import validate_model
from orchestrator.worker.data import DataConfig
from orchestrator.worker.engine import EngineConfig
from orchestrator.worker.local import run_local

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf-dataset"


@pytest.mark.slow  # data script, tokenizing, 2 ranks x 12 steps: ~45 s idle, ~150 s on a busy 2-core machine
def test_example_trains_on_its_saved_dataset(tmp_path: Path) -> None:
    work = tmp_path / "example"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("genesis", "tokenizer"))
    made = subprocess.run(
        [sys.executable, str(work / "make_data.py"), "--out", str(work)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    job = load_job(work / "job.yaml")
    wjob = worker_job(job, work / "job.yaml")
    validate_model(wjob, job.model.shape.num_planner_layers)  # tokenizes into the cache
    [cached] = (work / "genesis" / ".orchestrator-tokens").glob("*.bin")
    stamp = cached.stat().st_mtime_ns

    # 6 planner layers (embedding, 4 blocks, norm + head) on two stages, 2 microbatches of 4.
    plan = make_plan([(8, [((0, 3), "A100"), ((3, 6), "A100")])], microbatch_size=4)
    config = EngineConfig(
        model_factory=wjob.model_factory,
        model_kwargs=dict(wjob.model_kwargs),
        plan=plan,
        rank=0,
        data=DataConfig(**wjob.data),
        recipe=optimizer_recipe(job),
    )
    run = run_local(config, range(12), {}, timeout_s=300)
    losses = [r.loss for r in run.results[1]]
    assert all(loss is not None for loss in losses)
    first, last = losses[0], sum(losses[-3:]) / 3  # type: ignore[operator]
    assert first > 5.5  # about ln(512) at the start
    assert last < first - 0.5, losses  # 6.26 -> 5.49 when written
    assert cached.stat().st_mtime_ns == stamp  # the ranks read the cache, never rewrote it

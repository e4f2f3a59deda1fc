"""How a run is built and named: ``ElasticJob.from_file`` checks the job and its plan file before
anything starts, and a second run of a job whose controller is still live is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import yaml
from elastic_helpers import tiny_job_spec
from ray_plans import GLOBAL_BATCH, plan

from orchestrator.errors import SpecError, UserError
from orchestrator.runtime.elastic.controller_actor import start_controller
from orchestrator.runtime.elastic.session import JOB_METRICS_PORT, ElasticJob


def _write_job(tmp_path: Path, **extra: object) -> Path:
    job = tiny_job_spec("identity", 2, **extra).model_dump(mode="json", exclude_none=True)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_from_file_loads_the_fixed_plan_and_the_jobs_metrics_port(tmp_path: Path) -> None:
    fixed = plan((GLOBAL_BATCH, [(0, 6, "A100-80")]))
    (tmp_path / "plan.json").write_text(fixed.to_json())
    path = _write_job(tmp_path, plan="plan.json", metrics={"port": 9123})
    spec = ElasticJob.from_file(path, metrics_port=JOB_METRICS_PORT, steps=3)
    assert spec.plan == fixed and spec.plan_source == f"file {tmp_path / 'plan.json'}"
    assert spec.metrics_port == 9123 and spec.total_steps == 3
    planned = ElasticJob.from_file(_write_job(tmp_path))
    assert planned.plan is None and planned.plan_source == "planner"
    assert planned.metrics_port is None


def test_from_file_refuses_a_plan_of_another_batch_and_zero_steps(tmp_path: Path) -> None:
    other = plan((GLOBAL_BATCH // 2, [(0, 6, "A100-80")]))  # a valid plan for half the batch
    (tmp_path / "plan.json").write_text(other.to_json())
    with pytest.raises(SpecError, match=r"training\.global_batch_size"):
        ElasticJob.from_file(_write_job(tmp_path, plan="plan.json"))
    with pytest.raises(UserError, match="--steps"):
        ElasticJob.from_file(_write_job(tmp_path), steps=0)


def test_a_second_run_of_a_live_job_is_refused(ray_cluster: object, tmp_path: Path) -> None:
    spec = ElasticJob.from_file(_write_job(tmp_path))
    first = start_controller(spec)
    try:
        assert ray.get(first.metrics_url.remote()) is None  # up, serving nothing
        with pytest.raises(UserError, match="still live") as info:
            start_controller(spec, wait_for_old_s=0.5)
        assert "give this job another name" in str(info.value)
    finally:
        ray.kill(first, no_restart=True)

"""The runtime side of a plan's recorded precision: worker configs and the run's plan line."""

from __future__ import annotations

from orchestrator.runtime.actor import WorkerJob, engine_config
from orchestrator.runtime.elastic.session import ProgressLines
from orchestrator.spec.devices import Dtype
from orchestrator.spec.plan import Plan

PLAN = Plan.model_validate(
    {
        "global_batch_size": 8,
        "microbatch_size": 2,
        "replicas": [{"batch_size": 8, "stages": [{"layers": [0, 6], "device_type": "A100-80"}]}],
    }
)
JOB = WorkerJob(
    model_factory="orchestrator.models.gpt:make_gpt",
    model_kwargs={"num_layers": 4, "hidden_size": 32, "num_heads": 2, "sequence_length": 16},
    data={"sequence_length": 16},
    schedule="1f1b",
    optimizer="sgd",
    learning_rate=0.05,
    seed=0,
    extra={"precision": "fp32"},
)


def test_a_plans_precision_is_what_each_rank_is_configured_with() -> None:
    assert engine_config(JOB, PLAN.model_dump_json(), 0, 1.0).precision == "fp32"
    bf16 = PLAN.model_copy(update={"precision": Dtype.BF16})
    assert engine_config(JOB, bf16.model_dump_json(), 0, 1.0).precision == "bf16"


def test_the_run_prints_the_plans_precision() -> None:
    lines = ProgressLines(total_steps=2)
    lines.on_plan(PLAN.model_copy(update={"precision": Dtype.FP16}), 0.5, 0.4, "initial")
    lines.on_plan(PLAN, 0.5, 0.4, "initial")
    assert lines.lines[0].startswith("plan (planner): A100-80 x1; precision fp16; predicted")
    assert "precision" not in lines.lines[2]


def _job(tmp_path, precision: str | None):  # type: ignore[no-untyped-def]
    from orchestrator.spec.job import JobSpec

    training: dict[str, object] = {"global_batch_size": 8, "microbatch_sizes": [2], "steps": 1}
    if precision is not None:
        training["precision"] = precision
    return JobSpec.model_validate(
        {
            "name": "t",
            "model": {
                "factory": "orchestrator.models.gpt:make_gpt",
                "shape": {
                    "name": "gpt-t",
                    "num_layers": 4,
                    "hidden_size": 32,
                    "num_heads": 2,
                    "sequence_length": 16,
                    "vocab_size": 256,
                },
            },
            "data": {},
            "training": training,
            "metrics": {"port": None},
        }
    )


def test_a_fixed_plan_run_under_auto_or_a_named_format(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from orchestrator.errors import SpecError
    from orchestrator.runtime.elastic.session import ElasticJob

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(PLAN.to_json())
    job_file = tmp_path / "job.yaml"
    # auto, a plan recording nothing: the format its A100 layout runs fast is recorded.
    auto = ElasticJob.from_spec(_job(tmp_path, "auto"), job_file, plan_file=plan_file)
    assert auto.plan is not None and auto.plan.precision is Dtype.BF16
    # unset: the plan as written (fp32 workers).
    unset = ElasticJob.from_spec(_job(tmp_path, None), job_file, plan_file=plan_file)
    assert unset.plan is not None and unset.plan.precision is None
    plan_file.write_text(PLAN.model_copy(update={"precision": Dtype.FP16}).to_json())
    with pytest.raises(SpecError, match=r"contradicts training\.precision"):
        ElasticJob.from_spec(_job(tmp_path, "bf16"), job_file, plan_file=plan_file)

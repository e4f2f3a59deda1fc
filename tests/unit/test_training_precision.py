"""``training.precision``: what the workers compute in, and what the memory model then counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.runtime.jobs import worker_job
from orchestrator.spec.devices import Dtype
from orchestrator.spec.job import JobSpec
from orchestrator.spec.model import TrainingSpec

JOB = {
    "name": "p",
    "model": {
        "factory": "orchestrator.models.gpt:make_gpt",
        "shape": {
            "name": "tiny",
            "num_layers": 2,
            "hidden_size": 32,
            "num_heads": 4,
            "sequence_length": 16,
            "vocab_size": 256,
        },
    },
    "data": {},
}


def test_unset_precision_keeps_fp32_workers() -> None:
    assert TrainingSpec().runtime_precision is Dtype.FP32
    job = JobSpec.model_validate(JOB)
    assert worker_job(job, Path("job.yaml")).extra["precision"] == "fp32"


def test_precision_reaches_the_workers() -> None:
    job = JobSpec.model_validate({**JOB, "training": {"precision": "bf16"}})
    assert worker_job(job, Path("job.yaml")).extra["precision"] == "bf16"


def test_precision_sets_the_memory_model_bytes() -> None:
    # fp32 workers hold 4-byte weights and gradients, whatever the model's dtype says.
    assert TrainingSpec(precision=Dtype.FP32).grad_bytes_per_param(Dtype.BF16) == 4
    assert TrainingSpec(precision=Dtype.BF16).grad_bytes_per_param(Dtype.FP32) == 2
    assert TrainingSpec(precision=Dtype.BF16).state_bytes_per_param(Dtype.FP32) == 16


def test_contradicting_mixed_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision replaces it"):
        TrainingSpec(precision=Dtype.BF16, mixed_precision=False)

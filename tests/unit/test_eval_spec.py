"""training.eval_every / eval_batches: validated with the job, before anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from orchestrator.cli.main import main
from orchestrator.runtime.jobs import load_job, worker_job
from orchestrator.spec.job import JobSpec
from orchestrator.worker.evaluate import is_eval_step

SHAPE = {
    "name": "gpt-tiny",
    "num_layers": 2,
    "hidden_size": 32,
    "num_heads": 4,
    "sequence_length": 16,
    "vocab_size": 256,
    "dtype": "fp32",
}


def _job(data: dict[str, Any], **training: Any) -> dict[str, Any]:
    return {
        "name": "evaluated",
        "model": {"factory": "orchestrator.models.gpt:make_gpt", "shape": SHAPE},
        "data": data,
        "training": {"global_batch_size": 8, "steps": 4, **training},
    }


TOKENS = {"tokens": "train.bin", "validation_fraction": 0.1}


def test_eval_fields_default_off_and_accept_a_validation_split() -> None:
    assert JobSpec.model_validate(_job({})).training.eval_every is None
    job = JobSpec.model_validate(_job(TOKENS, eval_every=10, eval_batches=2))
    assert (job.training.eval_every, job.training.eval_batches) == (10, 2)
    # 0 is off, like None: no split needed.
    assert JobSpec.model_validate(_job({}, eval_every=0)).training.eval_every == 0


@pytest.mark.parametrize(
    ("data", "training", "says"),
    [
        ({"tokens": "train.bin"}, {"eval_every": 5}, "data.validation_fraction above 0"),
        ({}, {"eval_every": 5}, "data.tokens or data.hf_dataset"),
        (TOKENS, {"eval_every": -1}, "greater than or equal to 0"),
        (TOKENS, {"eval_every": 5, "eval_batches": 0}, "greater than 0"),
    ],
)
def test_bad_eval_settings_are_refused(
    data: dict[str, Any], training: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValidationError, match=says):
        JobSpec.model_validate(_job(data, **training))


def test_run_without_a_validation_split_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job({"tokens": "train.bin"}, eval_every=5)))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert "training.eval_every" in err and "data.validation_fraction" in err


def test_worker_job_carries_the_eval_settings(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job(TOKENS, eval_every=3, eval_batches=2)))
    extra = worker_job(load_job(path), path).extra
    assert (extra["eval_every"], extra["eval_batches"]) == (3, 2)


def test_eval_steps_are_every_nth_step_done() -> None:
    assert [s for s in range(10) if is_eval_step(s, 4)] == [3, 7]  # after 4 and 8 steps
    assert not any(is_eval_step(s, 0) for s in range(10))


def test_eval_mode_turns_dropout_off_and_puts_each_layer_back() -> None:
    import torch
    from torch import nn

    from orchestrator.worker.evaluate import eval_mode

    train, frozen = nn.Dropout(0.5), nn.Dropout(0.5).eval()
    x = torch.ones(1000)
    with eval_mode([train, frozen]):
        assert torch.equal(train(x), x)  # no dropout while evaluating
    assert train.training and not frozen.training
    assert not torch.equal(train(x), x)

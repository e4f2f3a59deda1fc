"""The job spec: what ``orchestrator run JOB.yaml`` trains, on which cluster, with which plan.

A job names a model factory by import path (users bring their own layered model), its shape
(:class:`~orchestrator.spec.model.ModelSpec`, whose planner layers the factory's layers match), the
data, the training settings, where checkpoints go, where metrics are served and which Ray cluster to
join. See docs/job.md. Pure data: no ray or torch here; the runtime turns it into worker configs.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from orchestrator.control.config import ElasticitySpec
from orchestrator.spec.model import ModelSpec, TrainingSpec

JOB_FORMAT = "orchestrator-job/v1"

# "package.module:function", the form entry points use.
IMPORT_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
DEFAULT_METRICS_PORT = 9400


def _check_import_path(value: str) -> str:
    if not re.match(IMPORT_PATH_PATTERN, value):
        raise ValueError(f"{value!r} is not an import path; write it as package.module:function")
    return value


ImportPath = Annotated[str, AfterValidator(_check_import_path)]


class Schedule(StrEnum):
    """Pipeline schedules the workers run."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"


class ModelSection(BaseModel):
    """The model: a factory by import path, the shape the planner sees, extra factory arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    factory: ImportPath
    shape: ModelSpec
    # Passed to the factory beside the shape (dropout, initialisation scale, ...).
    kwargs: dict[str, Any] = {}


class DataSection(BaseModel):
    """Training data: a text corpus read byte by byte, or a dataset factory by import path.

    With neither, the public-domain corpus shipped in the package is used. Batches are drawn
    deterministically from the seed and the step number, so every plan sees the same global batch
    at each step. A relative ``corpus`` path is relative to the job file's directory.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    corpus: str | None = None
    dataset: ImportPath | None = None
    # Passed to the dataset factory beside sequence_length and seed.
    kwargs: dict[str, Any] = {}

    @model_validator(mode="after")
    def _one_source(self) -> DataSection:
        if self.corpus is not None and self.dataset is not None:
            raise ValueError(
                "give corpus (a text file) or dataset (package.module:function), not both"
            )
        return self


class JobTrainingSection(TrainingSpec):
    """Planner training settings plus what a run needs: steps, learning rate, seed, schedule."""

    steps: PositiveInt = Field(default=100, le=1_000_000_000)
    learning_rate: PositiveFloat = 3e-4
    seed: int = Field(default=0, ge=0)
    schedule: Schedule = Schedule.ONE_F_ONE_B
    # Steps with a non-finite loss or gradient norm that may be skipped (their update dropped)
    # before training stops with an error; 0: stop at the first (docs/job.md).
    skip_nonfinite_steps: int = Field(default=0, ge=0, le=1000)

    def planner_spec(self) -> TrainingSpec:
        """The part the planner and cost model read."""
        return TrainingSpec.model_validate(self.model_dump(include=set(TrainingSpec.model_fields)))


# Checkpoint interval when the job does not set one (docs/job.md): frequent enough that a crash
# loses little, rare enough that saving costs little on a long run.
DEFAULT_CHECKPOINT_INTERVAL_STEPS = 50


class CheckpointSection(BaseModel):
    """Where layer-indexed checkpoints go and how often (0 = only at the end)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dir: str = Field(min_length=1)
    interval_steps: int = Field(default=DEFAULT_CHECKPOINT_INTERVAL_STEPS, ge=0)
    resume: bool = True


class MetricsSection(BaseModel):
    """Where the Prometheus endpoint listens (port 0: any free port; null: no endpoint)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int | None = Field(default=DEFAULT_METRICS_PORT, ge=0, le=65535)


class ClusterSection(BaseModel):
    """The Ray cluster to join: an address, or "auto" for the one this process runs in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str = "auto"
    # Seconds to wait for every worker's placement before giving up with a clear error.
    placement_timeout_s: PositiveFloat = 120.0
    # Seconds the workers wait for each other in the rendezvous.
    rendezvous_timeout_s: PositiveFloat = 120.0


class JobSpec(BaseModel):
    """One training job (``orchestrator run JOB.yaml``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = JOB_FORMAT
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    model: ModelSection
    data: DataSection
    training: JobTrainingSection = JobTrainingSection()
    checkpoint: CheckpointSection | None = None
    metrics: MetricsSection = MetricsSection()
    cluster: ClusterSection = ClusterSection()
    # How the run adapts to nodes joining, failing and draining (docs/controller.md).
    elasticity: ElasticitySpec = ElasticitySpec()
    # A fixed plan file (``orchestrator plan`` writes one); without it the planner chooses.
    plan: str | None = None
    # Measured profiles for the planner and the prediction (a file or a directory of them).
    profiles: str | None = None

    @model_validator(mode="after")
    def _format_known(self) -> JobSpec:
        if self.format != JOB_FORMAT:
            raise ValueError(f"unknown format {self.format!r}; this version reads {JOB_FORMAT!r}")
        return self

    def resolve_path(self, value: str, job_file: Path | str) -> Path:
        """A path in the job file, relative to the job file's directory unless absolute."""
        p = Path(value)
        return p if p.is_absolute() else Path(job_file).parent / p


def split_import_path(import_path: str) -> tuple[str, str]:
    """``"pkg.mod:fn"`` -> ``("pkg.mod", "fn")``."""
    if not re.match(IMPORT_PATH_PATTERN, import_path):
        raise ValueError(f"{import_path!r} is not of the form package.module:function")
    module, _, attr = import_path.partition(":")
    return module, attr

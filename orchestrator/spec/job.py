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
    ValidationInfo,
    model_validator,
)

from orchestrator.spec.elasticity import ElasticitySpec
from orchestrator.spec.model import ModelSpec, Schedule, TrainingSpec

JOB_FORMAT = "orchestrator-job/v1"

# "package.module:function", the form entry points use.
IMPORT_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
DEFAULT_METRICS_PORT = 9400


def _check_import_path(value: str) -> str:
    if not re.match(IMPORT_PATH_PATTERN, value):
        raise ValueError(f"{value!r} is not an import path; write it as package.module:function")
    return value


ImportPath = Annotated[str, AfterValidator(_check_import_path)]


HF_FACTORY = "orchestrator.models.hf_causal:make_hf_model"
STACK_FACTORY = "orchestrator.models.stack:make_stack_model"


def _resolved(data: dict[str, Any], factory: str) -> bool:
    """A section already resolved (a dumped job read again): its shape is kept as it is."""
    return data.get("factory") == factory and data.get("shape") is not None


class ModelSection(BaseModel):
    """The model: a factory by import path, the shape the planner sees, extra factory arguments.

    Or ``huggingface: DIR``, a Hugging Face model folder (relative to the job file): the shape is
    read from its config.json (training length ``sequence_length``, default the model's context)
    and the factory is the built-in adapter; ``pretrained`` loads its safetensors (default: when
    the folder has them). See docs/models.md.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    factory: ImportPath
    shape: ModelSpec
    # Passed to the factory beside the shape (dropout, initialisation scale, ...).
    kwargs: dict[str, Any] = {}
    huggingface: str | None = None
    pretrained: bool | None = None
    sequence_length: PositiveInt | None = None
    # Your own nn.Module ("module:function" returning embed/blocks/head/loss), with its vocab.
    stack: ImportPath | None = None
    vocab_size: PositiveInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_stack(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or data.get("stack") is None:
            return data
        if _resolved(data, STACK_FACTORY):
            return data
        if "factory" in data or "shape" in data or data.get("huggingface") is not None:
            raise ValueError("give stack (your module) alone: its shape is measured")
        if data.get("sequence_length") is None or data.get("vocab_size") is None:
            raise ValueError("stack needs sequence_length and vocab_size")
        # The shape is measured from the module itself (counted parameters, one forward): that
        # needs torch and the user's module, which the spec layer does not import, so the
        # measurer comes from whoever reads the job (orchestrator.runtime.jobs.load_job).
        measured_shape = (info.context or {}).get("measure_stack")
        if measured_shape is None:
            raise ValueError(
                "the stack form is measured when a job is run: read this job with "
                "orchestrator.runtime.jobs.load_job (orchestrator run, profile and export do)"
            )
        build_kwargs = dict(data.get("kwargs") or {})
        shape = measured_shape(
            str(data["stack"]), int(data["sequence_length"]), int(data["vocab_size"]), build_kwargs
        )
        kwargs = {"module": data["stack"], "build_kwargs": build_kwargs}
        return {**data, "factory": STACK_FACTORY, "shape": shape, "kwargs": kwargs}

    @model_validator(mode="before")
    @classmethod
    def _from_huggingface(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or data.get("huggingface") is None:
            return data
        if _resolved(data, HF_FACTORY):
            return data
        if "factory" in data or "shape" in data:
            raise ValueError(
                "give huggingface (a model folder) or factory and shape, not both: "
                "the shape comes from the folder's config.json"
            )
        from orchestrator.spec.hf_config import load_hf_model_spec

        source = (info.context or {}).get("source")
        folder = Path(str(data["huggingface"]))
        if source is not None and not folder.is_absolute():
            folder = Path(source).parent / folder
        shape = load_hf_model_spec(folder, data.get("sequence_length"))
        kwargs = {**dict(data.get("kwargs") or {}), "path": str(folder)}
        if data.get("pretrained") is not None:
            kwargs["pretrained"] = data["pretrained"]
        return {**data, "factory": HF_FACTORY, "shape": shape, "kwargs": kwargs}


class TokenDtype(StrEnum):
    """Width of the ids in a token file."""

    UINT16 = "uint16"  # vocabularies up to 65,536 (GPT-2's 50,257)
    UINT32 = "uint32"


class DataSection(BaseModel):
    """Training data: a text corpus read byte by byte, a token file, a Hugging Face dataset saved
    to disk (tokenized once into a cached token file), or a dataset factory by import path.

    With neither, the public-domain corpus shipped in the package is used. Batches are drawn
    deterministically from the seed and the step number, so every plan sees the same global batch
    at each step. A relative ``corpus`` path is relative to the job file's directory.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    corpus: str | None = None
    dataset: ImportPath | None = None
    # Passed to the dataset factory beside sequence_length and seed.
    kwargs: dict[str, Any] = {}
    # A flat binary of token ids (nanoGPT's train.bin; `orchestrator data prepare` writes one).
    tokens: str | None = None
    dtype: TokenDtype = TokenDtype.UINT16
    # The last fraction of the token file's windows, never trained on (validation).
    validation_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    # A Hugging Face dataset saved to disk (Dataset.save_to_disk), its text or token-id column,
    # a local tokenizer folder (for text) and the split of a saved DatasetDict; docs/models.md.
    hf_dataset: str | None = None
    column: str | None = None
    tokenizer: str | None = None
    split: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> DataSection:
        given = [
            n for n in ("corpus", "dataset", "tokens", "hf_dataset") if getattr(self, n) is not None
        ]
        if len(given) > 1:
            raise ValueError(
                f"give one of corpus (a text file), tokens (a token file), hf_dataset (a saved "
                f"dataset) or dataset (package.module:function), not {' and '.join(given)}"
            )
        stray = [n for n in ("column", "tokenizer", "split") if getattr(self, n) is not None]
        if stray and self.hf_dataset is None:
            them = "it" if len(stray) == 1 else "them"
            raise ValueError(
                f"{' and '.join(stray)} only go with hf_dataset: add hf_dataset or drop {them}"
            )
        return self


class LrDecay(StrEnum):
    """Learning-rate decay after the warm-up."""

    CONSTANT = "constant"
    LINEAR = "linear"
    COSINE = "cosine"


class JobTrainingSection(TrainingSpec):
    """Planner training settings plus what a run needs: steps, learning rate, seed, schedule."""

    steps: PositiveInt = Field(default=100, le=1_000_000_000)
    learning_rate: PositiveFloat = 3e-4
    seed: int = Field(default=0, ge=0)
    schedule: Schedule = Schedule.ONE_F_ONE_B
    # The optimizer recipe (orchestrator.worker.recipe): decay on matrices only, a warm-up then
    # a decay to min_learning_rate at lr_decay_steps (default: steps), global-norm clipping.
    weight_decay: float = Field(default=0.0, ge=0.0)
    warmup_steps: int = Field(default=0, ge=0)
    lr_decay: LrDecay = LrDecay.CONSTANT
    lr_decay_steps: PositiveInt | None = None
    min_learning_rate: float = Field(default=0.0, ge=0.0)
    grad_clip_norm: PositiveFloat | None = None
    # Steps with a non-finite loss or gradient norm that may be skipped (their update dropped)
    # before training stops with an error; 0: stop at the first (docs/job.md).
    skip_nonfinite_steps: int = Field(default=0, ge=0, le=1000)
    # Validation loss every eval_every steps (after that step's update) over eval_batches global
    # batches of the held-out split (data.validation_fraction); None or 0: never (docs/job.md).
    eval_every: int | None = Field(default=None, ge=0, le=1_000_000_000)
    eval_batches: PositiveInt = Field(default=4, le=10_000)

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

    @model_validator(mode="after")
    def _eval_has_validation_split(self) -> JobSpec:
        if not self.training.eval_every:
            return self
        if self.data.tokens is None and self.data.hf_dataset is None:
            raise ValueError(
                "training.eval_every needs a held-out split: give data.tokens or "
                "data.hf_dataset with data.validation_fraction above 0, or drop eval_every"
            )
        if self.data.validation_fraction == 0:
            raise ValueError(
                "training.eval_every needs a held-out split: set data.validation_fraction "
                "above 0 (e.g. 0.05), or drop eval_every"
            )
        return self

    def resolve_path(self, value: str, job_file: Path | str) -> Path:
        """A path in the job file, relative to the job file's directory unless absolute."""
        p = Path(value)
        return p if p.is_absolute() else Path(job_file).parent / p

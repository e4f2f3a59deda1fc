"""From a job spec to the plain data every worker receives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.runtime.actor import WorkerJob
from orchestrator.spec.job import JobSpec
from orchestrator.spec.loading import load_spec
from orchestrator.spec.model import ModelSpec
from orchestrator.worker.recipe import OptimizerRecipe


def _measure_stack(
    build: str, sequence_length: int, vocab_size: int, build_kwargs: dict[str, Any]
) -> ModelSpec:
    # Imported here: it imports torch and the user's module, only for the ``stack`` form.
    from orchestrator.models.stack import measured_shape

    return measured_shape(build, sequence_length, vocab_size, build_kwargs)


def load_job(path: Path | str) -> JobSpec:
    """Read and validate a job file; a ``stack`` model's shape is measured from the module."""
    return load_spec(JobSpec, path, context={"measure_stack": _measure_stack})


def model_kwargs(job: JobSpec) -> dict[str, object]:
    """The factory's keyword arguments: the shape's fields, then the job's extra kwargs."""
    shape = job.model.shape.model_dump(mode="json", exclude_none=True)
    return {**shape, **job.model.kwargs}


def worker_job(job: JobSpec, job_file: Path | str) -> WorkerJob:
    """The :class:`WorkerJob` of ``job``; a relative corpus path is taken from the job file's
    directory (kept relative, so workers resolve it in their own working directory)."""
    corpus = job.data.corpus
    if corpus is not None:
        corpus = str(job.resolve_path(corpus, job_file))
    tokens = job.data.tokens
    if tokens is not None:
        tokens = str(job.resolve_path(tokens, job_file))
    hf_data = _hf_dataset_fields(job, job_file)
    return WorkerJob(
        model_factory=job.model.factory,
        model_kwargs=model_kwargs(job),
        data={
            "sequence_length": job.model.shape.sequence_length,
            "corpus_path": corpus,
            "dataset_factory": job.data.dataset,
            "dataset_kwargs": tuple(sorted(job.data.kwargs.items())),
            "token_file": tokens,
            "token_dtype": job.data.dtype.value,
            "validation_fraction": job.data.validation_fraction,
            **hf_data,
            "global_batch_size": job.training.global_batch_size,
            "vocab_size": job.model.shape.vocab_size,
        },
        schedule=job.training.schedule,
        optimizer=job.training.optimizer,
        learning_rate=job.training.learning_rate,
        seed=job.training.seed,
        extra={
            "recipe": optimizer_recipe(job),
            "precision": job.training.runtime_precision.value,
            "skip_nonfinite_steps": job.training.skip_nonfinite_steps,
            "eval_every": job.training.eval_every or 0,
            "eval_batches": job.training.eval_batches,
        },
    )


def _hf_dataset_fields(job: JobSpec, job_file: Path | str) -> dict[str, object]:
    """The ``hf_dataset`` form's worker data fields, its folders relative to the job file."""
    d = job.data
    if d.hf_dataset is None:
        return {}
    tokenizer = str(job.resolve_path(d.tokenizer, job_file)) if d.tokenizer else None
    return {
        "hf_dataset": str(job.resolve_path(d.hf_dataset, job_file)),
        "hf_column": d.column or "text",
        "hf_tokenizer": tokenizer,
        "hf_split": d.split or "train",
    }


def optimizer_recipe(job: JobSpec) -> OptimizerRecipe:
    """The job's optimizer, weight decay, learning-rate schedule and clipping."""
    t = job.training
    return OptimizerRecipe(
        name=t.optimizer.value,
        learning_rate=t.learning_rate,
        weight_decay=t.weight_decay,
        warmup_steps=t.warmup_steps,
        decay=t.lr_decay.value,
        decay_steps=t.lr_decay_steps or t.steps,
        min_learning_rate=t.min_learning_rate,
        grad_clip_norm=t.grad_clip_norm,
    )

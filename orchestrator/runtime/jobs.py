"""From a job spec to the plain data every worker receives."""

from __future__ import annotations

from pathlib import Path

from orchestrator.runtime.actor import WorkerJob
from orchestrator.spec.job import JobSpec


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
    return WorkerJob(
        model_factory=job.model.factory,
        model_kwargs=model_kwargs(job),
        data={
            "sequence_length": job.model.shape.sequence_length,
            "corpus_path": corpus,
            "dataset_factory": job.data.dataset,
            "dataset_kwargs": tuple(sorted(job.data.kwargs.items())),
        },
        schedule=job.training.schedule.value,
        optimizer=job.training.optimizer.value,
        learning_rate=job.training.learning_rate,
        seed=job.training.seed,
        extra={"skip_nonfinite_steps": job.training.skip_nonfinite_steps},
    )

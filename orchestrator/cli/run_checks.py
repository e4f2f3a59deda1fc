"""Checks of ``run``/``profile`` input that need no Ray: the address, and every path in the job.

All run before the command connects to Ray (so before any actor or placement group exists), and
each mistake is one :class:`~orchestrator.errors.UserError` naming the field or flag and the fix.
An address that is well formed but answers nothing fails within ``REACH_TIMEOUT_S`` instead of
Ray's own minutes of retries.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.spec.job import JobSpec

REACH_TIMEOUT_S = 5.0


def split_ray_address(address: str, field: str) -> tuple[str, int] | None:
    """``host:port`` / ``ray://host:port`` -> (host, port); None for ``auto``; else an error."""
    text = address.strip()
    if text in ("auto", ""):
        return None
    for scheme in ("ray://", "http://", "https://"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
            break
    else:
        if "://" in text:
            raise UserError(
                f"{address!r} has an unknown scheme",
                field=field,
                fix="give HOST:PORT (the head's GCS port, e.g. 10.0.0.5:6379) or auto",
            )
    host, sep, port_text = text.rstrip("/").rpartition(":")
    if not sep or not host:
        raise UserError(
            f"{address!r} is not HOST:PORT", field=field, fix="e.g. 10.0.0.5:6379, or auto"
        )
    try:
        port = int(port_text)
    except ValueError:
        raise UserError(
            f"port {port_text!r} of {address!r} is not a number",
            field=field,
            fix="give HOST:PORT with a port 1..65535",
        ) from None
    if not 1 <= port <= 65535:
        raise UserError(
            f"port {port} of {address!r} is out of range", field=field, fix="use a port 1..65535"
        )
    return host.strip("[]"), port


def check_ray_address(address: str, field: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Refuse a malformed address, or one where nothing accepts a connection within timeout."""
    parsed = split_ray_address(address, field)
    if parsed is None:
        return  # "auto": Ray itself says at once when no cluster runs here
    host, port = parsed
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise UserError(
            f"nothing answers at {host}:{port} within {timeout_s:g} s ({reason})",
            field=field,
            fix="check the address (the head's GCS port, 6379 by default) and that Ray runs "
            "there (`ray status`)",
        ) from None


def check_job_paths(job: JobSpec, job_file: Path, plan_file: Path | None) -> None:
    """Every path the job names exists and is of the right kind; the plan file loads."""
    from orchestrator.spec.loading import load_plan

    plan_path = plan_file or (job.resolve_path(job.plan, job_file) if job.plan else None)
    if plan_path is not None:
        field = "--plan" if plan_file is not None else "plan"
        _file(plan_path, field, "a plan file from `orchestrator plan --out`")
        plan = load_plan(plan_path)
        from orchestrator.cli.plan_checks import check_microbatch

        check_microbatch(plan, field=f"{field} microbatch_size")
        from orchestrator.cli.plan_checks import check_plan_precision

        check_plan_precision(plan, job.training, field=f"{field} precision")
        if plan.global_batch_size != job.training.global_batch_size:
            raise UserError(
                f"the plan's global batch ({plan.global_batch_size}) differs from "
                f"training.global_batch_size ({job.training.global_batch_size})",
                field=field,
                fix="make them equal, or re-plan for this job",
            )
    if job.profiles is not None:
        path = job.resolve_path(job.profiles, job_file)
        if not path.exists():
            raise UserError(
                f"{path} does not exist",
                field="profiles",
                fix="run `orchestrator profile` first, or drop profiles:",
            )
        _check_profiles(path, job)
    if job.data.corpus is not None:
        _file(job.resolve_path(job.data.corpus, job_file), "data.corpus", "a text file")
    if job.checkpoint is not None:
        _writable_dir(job.resolve_path(job.checkpoint.dir, job_file), "checkpoint.dir")


def _check_profiles(path: Path, job: JobSpec) -> None:
    """The profiles load as the controller will load them (an empty folder, an unknown format, a
    bad or conflicting file is refused), and this model's name no layer it does not have; a file
    for another model, sequence length or dtype is named on stderr (the run leaves it out)."""
    from orchestrator.cli.profile_filter import profiles_for_model

    profiles_for_model([path], job.model.shape)


def _file(path: Path, field: str, what: str) -> None:
    if path.is_dir():
        raise UserError(f"{path} is a folder", field=field, fix=f"give {what}")
    if not path.is_file():
        raise UserError(f"{path} does not exist", field=field, fix=f"give {what}")


def _writable_dir(path: Path, field: str) -> None:
    """``path`` is (or can become) a folder this process can write."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UserError(
            f"{probe} is a file, so {path} cannot be a folder",
            field=field,
            fix="give a folder path",
        )
    try:  # a probe, not permission bits: they do not bind every user (root), nor every file system
        os.rmdir(tempfile.mkdtemp(prefix=".orchestrator-probe-", dir=probe))
    except OSError as exc:
        raise UserError(
            f"cannot create folders in {probe}: {exc.strerror or exc}",
            field=field,
            fix="give a writable folder",
        ) from None


# Ray unpacks `ray job submit --working-dir` into its session's runtime resources, which go away
# with the session; a checkpoint folder relative to a job file there would go with them.
_RAY_WORKING_DIR_MARKERS = ("runtime_resources", "working_dir_files")
CHECKPOINT_ROOT_ENV = "ORCHESTRATOR_CHECKPOINT_ROOT"


def in_ray_working_dir(job_file: Path) -> bool:
    parts = Path(job_file).resolve().parts
    return all(marker in parts for marker in _RAY_WORKING_DIR_MARKERS)


def stable_checkpoints(job: JobSpec, job_file: Path) -> JobSpec:
    """``job`` with a checkpoint folder that outlives the Ray session (see docs/job.md).

    A relative ``checkpoint.dir`` of a job file inside Ray's unpacked working directory moves to
    ``$ORCHESTRATOR_CHECKPOINT_ROOT/<job name>/<dir>`` (default root
    ``~/orchestrator-checkpoints``); elsewhere, and for absolute folders, nothing changes.
    """
    ckpt = job.checkpoint
    if ckpt is None or Path(ckpt.dir).is_absolute() or not in_ray_working_dir(job_file):
        return job
    root = Path(os.environ.get(CHECKPOINT_ROOT_ENV) or Path.home() / "orchestrator-checkpoints")
    stable = (root / job.name / ckpt.dir).resolve()
    return job.model_copy(update={"checkpoint": ckpt.model_copy(update={"dir": str(stable)})})


def describe_checkpoints(job: JobSpec, job_file: Path) -> str:
    """The line ``run`` prints about where checkpoints go."""
    from orchestrator.spec.job import DEFAULT_CHECKPOINT_INTERVAL_STEPS

    ckpt = job.checkpoint
    if ckpt is None:  # every run goes through the controller, which snapshots in memory
        return (
            f"checkpoints: in memory only, every {DEFAULT_CHECKPOINT_INTERVAL_STEPS} steps "
            "(set checkpoint.dir to keep them on disk)"
        )
    where = job.resolve_path(ckpt.dir, job_file).resolve()
    every = (
        f"every {ckpt.interval_steps} steps and at the end" if ckpt.interval_steps else "at the end"
    )
    return f"checkpoints: {where} ({every})"

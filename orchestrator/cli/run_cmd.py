"""``orchestrator run JOB.yaml``: train a job on the current Ray cluster.

With the job's plan file (or ``--plan``) the plan is fixed; without one the run is elastic: a
controller actor plans for the live cluster and re-plans when nodes join, fail or drain.
Every check that needs no actor runs first; a mistake is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator.spec.job import JobSpec
from orchestrator.spec.loading import load_spec


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="train a job (JOB.yaml) on Ray, elastically unless its plan is fixed",
        description="Train the job described in JOB.yaml (docs/job.md) on a Ray cluster.",
    )
    parser.add_argument("job", type=Path, help="job spec (YAML or JSON)")
    parser.add_argument("--address", help="Ray cluster address (overrides cluster.address)")
    parser.add_argument("--plan", type=Path, help="plan file (overrides the job's plan)")
    parser.add_argument("--steps", type=int, help="steps to train (overrides training.steps)")
    parser.add_argument(
        "--metrics-port", type=int, help="Prometheus port (overrides metrics.port; 0: any free)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.errors import UserError

    job = load_spec(JobSpec, args.job)
    if args.address:
        job = job.model_copy(
            update={"cluster": job.cluster.model_copy(update={"address": args.address})}
        )
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps {args.steps} must be >= 1", field="--steps", fix="pass 1 or more")
    port = args.metrics_port if args.metrics_port is not None else job.metrics.port
    if port is not None and not 0 <= port <= 65535:
        raise UserError(f"{port} is out of range", field="--metrics-port", fix="use 0..65535")
    from orchestrator.cli.run_checks import check_job_paths, check_ray_address

    # Before any Ray call: a bad path or address is one line, and nothing has started.
    check_job_paths(job, args.job, args.plan)
    from orchestrator.runtime.jobs import worker_job
    from orchestrator.runtime.validation import validate_model

    validate_model(worker_job(job, args.job), job.model.shape.num_planner_layers)  # factory
    check_ray_address(job.cluster.address, "--address" if args.address else "cluster.address")
    from orchestrator.cli.run_checks import describe_checkpoints, stable_checkpoints

    job = stable_checkpoints(job, args.job)
    elastic = args.plan is None and job.plan is None
    print(describe_checkpoints(job, args.job, elastic), flush=True)
    from orchestrator.runtime.run import run_job

    def out(line: str) -> None:
        print(line, flush=True)

    if args.plan is None and job.plan is None:  # elastic: the controller serves its metrics
        from orchestrator.runtime.elastic.controller_actor import RunFailedError

        try:
            run_job(job, args.job, steps=args.steps, out=out, metrics_port=port)
        except RunFailedError as exc:
            print(f"orchestrator run: {exc}", file=sys.stderr, flush=True)
            return 1
        return 0
    from orchestrator.errors import PermanentError

    server, callbacks = _telemetry(job, port)
    try:
        run_job(job, args.job, plan_file=args.plan, steps=args.steps, callbacks=callbacks, out=out)
    except PermanentError as exc:  # a non-finite step, a worker's error: retrying will not help
        print(f"orchestrator run: training stopped: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if server is not None:
            server.stop()
    return 0


def _telemetry(job: JobSpec, port: int | None) -> tuple[Any, list[Any]]:
    """Start the Prometheus endpoint when a port is set; a failure to start is only a warning."""
    if port is None:
        return None, []
    from orchestrator.errors import UserError
    from orchestrator.telemetry.metrics import PrometheusCallback
    from orchestrator.telemetry.server import TelemetryServer

    callback = PrometheusCallback(job.name)
    server = TelemetryServer(callback.registry, host=job.metrics.host, port=port)
    try:
        server.start()
    except UserError as exc:
        print(f"warning: metrics not served: {exc}", file=sys.stderr, flush=True)
        return None, [callback]
    print(f"metrics: {server.url}/metrics", flush=True)
    return server, [callback]

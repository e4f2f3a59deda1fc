"""``orchestrator run JOB.yaml``: train a job on the current Ray cluster.

One path for every job: a controller actor plans for the live cluster (or, with the job's plan
file or ``--plan``, keeps that plan), trains, checkpoints, and handles nodes that join, fail or
drain. Every check that needs no actor runs first; a mistake is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="train a job (JOB.yaml) on Ray; re-plans on changes unless its plan is fixed",
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
    from orchestrator.cli.run_checks import (
        check_job_paths,
        check_ray_address,
        describe_checkpoints,
        stable_checkpoints,
    )
    from orchestrator.errors import UserError
    from orchestrator.runtime.elastic.controller_actor import RunFailedError, run_elastic
    from orchestrator.runtime.elastic.session import JOB_METRICS_PORT, ElasticJob
    from orchestrator.runtime.jobs import load_job, worker_job
    from orchestrator.runtime.validation import validate_model

    job = load_job(args.job)
    if args.address:
        job = job.model_copy(
            update={"cluster": job.cluster.model_copy(update={"address": args.address})}
        )
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps {args.steps} must be >= 1", field="--steps", fix="pass 1 or more")
    port = args.metrics_port if args.metrics_port is not None else job.metrics.port
    if port is not None and not 0 <= port <= 65535:
        raise UserError(f"{port} is out of range", field="--metrics-port", fix="use 0..65535")
    # Before any Ray call: a bad path, factory or address is one line, and nothing has started.
    check_job_paths(job, args.job, args.plan)
    validate_model(worker_job(job, args.job), job.model.shape.num_planner_layers)
    check_ray_address(job.cluster.address, "--address" if args.address else "cluster.address")
    job = stable_checkpoints(job, args.job)
    spec = ElasticJob.from_spec(
        job,
        args.job,
        plan_file=args.plan,
        steps=args.steps,
        metrics_port=args.metrics_port if args.metrics_port is not None else JOB_METRICS_PORT,
    )
    print(describe_checkpoints(job, args.job), flush=True)

    def out(line: str) -> None:
        print(line, flush=True)

    try:
        run_elastic(spec, out)
    except RunFailedError as exc:
        print(f"orchestrator run: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0

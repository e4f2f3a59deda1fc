"""``orchestrator profile JOB.yaml``: measure the job's model on every device type of the cluster.

One actor per device type present runs the profiler on a node of that type (emulated speeds
stretch the times, and the files and the output say "emulated"). Profiles land in
``OUT/<model>/<device type>.json``, where ``orchestrator run`` and ``orchestrator plan`` read them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.runtime.jobs import load_job


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="measure the job's model on each device type of the current Ray cluster",
        description=(
            "Profile per-layer forward/backward/update seconds and memory of the job's model, "
            "for its microbatch sizes, on every device type present (docs/job.md)."
        ),
    )
    parser.add_argument("job", type=Path, help="job spec (YAML or JSON)")
    parser.add_argument("--out", type=Path, help="output directory (default: the job's profiles)")
    parser.add_argument(
        "--cache",
        type=Path,
        help="profile cache directory (default ~/.cache/orchestrator/profiles, or a temp folder "
        "when that cannot be written)",
    )
    parser.add_argument("--force", action="store_true", help="measure again even if cached")
    parser.add_argument("--address", help="Ray cluster address (overrides cluster.address)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.errors import UserError

    job = load_job(args.job)
    if args.out is not None:
        out_dir = args.out
    elif job.profiles is not None:
        out_dir = job.resolve_path(job.profiles, args.job)
    else:
        raise UserError(
            "no output directory", field="--out", fix="pass --out DIR or set profiles: in the job"
        )
    from orchestrator.cli.cache_dir import resolve_profile_cache
    from orchestrator.cli.run_checks import check_ray_address

    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} is a file", field="--out", fix="give a folder for the profiles")
    cache = resolve_profile_cache(args.cache, "--cache")
    address = args.address or job.cluster.address
    check_ray_address(address, "--address" if args.address else "cluster.address")
    from orchestrator.runtime.discovery import connect, discover_nodes
    from orchestrator.runtime.jobs import worker_job
    from orchestrator.runtime.profiling import profile_device_types
    from orchestrator.runtime.validation import validate_model

    wjob = worker_job(job, args.job)
    validate_model(wjob, job.model.shape.num_planner_layers)
    connect(args.address or job.cluster.address)
    done = profile_device_types(
        wjob,
        discover_nodes(),
        job.training.microbatch_sizes,
        out_dir,
        cache,
        force=args.force,
        out=lambda line: print(line, flush=True),
    )
    for item in done:
        how = "cached" if item.from_cache else "measured"
        emulated = f", emulated x{item.slowdown_factor:g}" if item.emulated else ""
        print(f"{item.device_type}: {how}{emulated} -> {item.path}", flush=True)
    return 0

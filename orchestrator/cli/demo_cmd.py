"""``orchestrator demo``: elastic training on a local emulated mixed cluster, with nothing else.

Starts a local multi-node Ray cluster of emulated device types (1x A100-80, 3x T4), profiles the
example GPT on each type, trains it with the elastic controller, crashes an A100 node mid-run,
adds an L4 node later, and prints a summary. Stops every process it started; exits 1 if training
did not complete. See docs/demo.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

from orchestrator.demo.scenario import DEFAULT_STEPS


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="train the example GPT on a local emulated mixed cluster through a crash and a join",
        description=(
            "Start a local Ray cluster of emulated 1x A100 + 3x T4 nodes, profile and train the "
            "example GPT elastically, crash a node mid-run, add an L4 node later, and summarise."
        ),
    )
    parser.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, help=f"training steps (default {DEFAULT_STEPS})"
    )
    parser.add_argument("--seed", type=int, default=0, help="model and data seed (default 0)")
    parser.add_argument("--no-failure", action="store_true", help="do not crash a node")
    parser.add_argument(
        "--json", action="store_true", help="print the summary as JSON (and nothing else)"
    )
    parser.add_argument(
        "--workdir", type=Path, help="keep the job, profiles, checkpoints and logs here"
    )
    parser.add_argument(
        "--profile-cache",
        type=Path,
        help="profile cache directory (the same as `orchestrator profile`'s; default "
        "~/.cache/orchestrator/profiles, or a temp folder when that cannot be written)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.cli.cache_dir import resolve_profile_cache
    from orchestrator.demo.scenario import DemoScenario

    scenario = DemoScenario(steps=args.steps, seed=args.seed, failure=not args.no_failure)
    profile_cache = resolve_profile_cache(args.profile_cache, "--profile-cache")
    keep = args.workdir is not None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="orchestrator-demo-"))
    from orchestrator.demo.output import DemoOutput
    from orchestrator.demo.report import render
    from orchestrator.demo.runner import run_demo

    output = DemoOutput(quiet=args.json)
    # A SIGTERM unwinds like Ctrl-C, so the finally blocks stop every process the demo started.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from orchestrator.demo.cluster import ClusterStartError

    try:
        summary = run_demo(scenario, workdir.resolve(), output, profile_cache)
    except ClusterStartError as exc:  # the work failed (not the input): one line, exit 1
        print(f"orchestrator demo: error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if not keep:
        summary.workdir = f"{workdir} (removed; pass --workdir to keep it)"
    if args.json:
        print(json.dumps(summary.to_json(), indent=2), flush=True)
    else:
        for line in render(summary):
            print(line, flush=True)
    return 0 if summary.completed else 1


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)

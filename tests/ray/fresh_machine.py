"""Run as a script with a fresh ``TMPDIR`` and ``HOME``: the demo's local cluster, then commands.

``python fresh_machine.py OUT.json [JOB.yaml PLAN.json | --fail-start]`` starts the demo's
local cluster (one emulated A100-80 node), and with a job runs ``orchestrator profile``
(default cache) and a two-step ``orchestrator run`` against it, each a subprocess with this
process's environment. With ``--fail-start`` the second node's start fails (after the head's
processes started). It stops the cluster and writes to OUT.json what happened, including every
process it started that is still alive afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from orchestrator.demo.cluster import LocalCluster, NodeKind
from orchestrator.runtime.local_ray import child_pids


def _cli(*argv: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=400,
    )
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def main() -> None:
    out_file = sys.argv[1]
    result: dict[str, object] = {}
    cluster = LocalCluster()
    result["temp_dir"] = cluster.temp_dir
    fail_start = sys.argv[2:] == ["--fail-start"]
    try:
        if fail_start:
            try:
                cluster.start([NodeKind("A100-80", 1.0), NodeKind("T4", 0.2, num_devices=-1)])
            except Exception as exc:
                result["start_error"] = type(exc).__name__
                result["left_after_failed_start"] = sorted(child_pids())
                return
        cluster.start([NodeKind("A100-80", 1.0)])
        result["started"] = True
        result["ray_tmpdir_during"] = os.environ.get("RAY_TMPDIR")
        if len(sys.argv) > 3:
            job, plan = sys.argv[2], sys.argv[3]
            profiles = os.path.join(os.path.dirname(job), "profiles")
            result["profile"] = _cli(
                "profile", job, "--address", cluster.address, "--out", profiles
            )
            result["run"] = _cli(
                "run", job, "--address", cluster.address, "--plan", plan, "--steps", "2"
            )
    finally:
        cluster.shutdown()
        _report(cluster, result, out_file)


def _report(cluster: LocalCluster, result: dict[str, object], out_file: str) -> None:
    result["ray_tmpdir_after"] = os.environ.get("RAY_TMPDIR")
    deadline = time.monotonic() + 10
    while child_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    result["left_running"] = sorted(child_pids())
    result["temp_dir_left"] = os.path.exists(cluster.temp_dir)
    with open(out_file, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

"""Every command in docs/kubernetes.md: run here where it needs no cluster, else listed as such."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from chart_support import ROOT, helm_binary

DOC = ROOT / "docs" / "kubernetes.md"
# Commands that need a Kubernetes cluster (or are the test runner itself): not run here. The
# operator entry point runs in tests/operators/test_operator_e2e.py against the API emulator.
NEEDS_CLUSTER = ("helm repo add", "helm install", "helm upgrade", "helm uninstall", "kubectl",
                 "python -m operators.hetero", "scripts/test.sh",
                 # No registry or container engine here: tests/image lints the Dockerfile and
                 # runs its install steps instead.
                 "docker ")
RUNNABLE = ("helm lint", "helm template", "scripts/install_helm.sh", "hadolint",
            "python scripts/chart_job_schema.py", "orchestrator status")


def doc_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_every_command_is_classified() -> None:
    commands = doc_commands()
    assert len(commands) >= 10
    for command in commands:
        assert command.startswith(NEEDS_CLUSTER + RUNNABLE), f"unclassified: {command}"


@pytest.mark.parametrize("command", [c for c in doc_commands() if c.startswith(RUNNABLE)])
def test_runnable_command_succeeds(command: str, tmp_path: Path) -> None:
    argv = shlex.split(command)
    if argv[0] == "orchestrator":
        _run_status_against_a_controller(argv)
        return
    if argv[0] == "helm":
        argv[0] = helm_binary()
    elif argv[0] in ("python", "hadolint"):
        argv[0] = sys.executable if argv[0] == "python" else str(
            Path(sys.executable).with_name("hadolint"))
    elif argv[0] == "scripts/install_helm.sh":
        argv = ["bash", str(ROOT / argv[0]), str(tmp_path / "bin")]  # not over the CI's copy
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    if argv[0] == "bash":
        assert (tmp_path / "bin" / "helm").exists() and (tmp_path / "bin" / "kubectl").exists()
    if "template" in argv:
        assert "kind: RayJob" in result.stdout and "rayClusterSpec:" in result.stdout


def _run_status_against_a_controller(argv: list[str]) -> None:
    """`orchestrator status --address ...` against a controller's telemetry server on a free
    port (the port-forward's local end, here without a cluster)."""
    from orchestrator.telemetry import Telemetry

    telemetry = Telemetry("gpt-small", port=0)
    with telemetry.server:
        address = argv.index("--address") + 1
        argv[address] = telemetry.server.url
        result = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *argv[1:]],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "gpt-small" in result.stdout

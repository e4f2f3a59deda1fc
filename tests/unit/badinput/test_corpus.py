"""The bad-input corpus: every user mistake is one line naming the field/flag/file, exit code 2.

Each case is a file under ``cases/`` (see ``cases/README.md`` for the format): the command line,
the input files it needs (on top of a named base set from ``bases.yaml``), and the expected
outcome: the exit code, a fragment the error line must hold, and files that must not exist
afterwards. Cases run in-process through ``orchestrator.cli.main.main`` (fast); those marked
``subprocess: true`` run the installed command in a child process, as a user would.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli.main import main

HERE = Path(__file__).parent
CASES = sorted((HERE / "cases").rglob("*.yaml"))
BASES: dict[str, dict[str, str]] = yaml.safe_load((HERE / "bases.yaml").read_text())


def _case(path: Path) -> dict[str, Any]:
    case = yaml.safe_load(path.read_text())
    assert isinstance(case, dict) and "argv" in case and "expect" in case, path
    return case


def _materialise(case: dict[str, Any], where: Path) -> None:
    files: dict[str, str] = {}
    for base in case.get("base", []):
        files.update(BASES[base])
    files.update(case.get("files") or {})
    for name, text in files.items():
        target = where / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for name, hex_bytes in (case.get("hex_files") or {}).items():
        (where / name).write_bytes(bytes.fromhex(hex_bytes))
    for name in case.get("dirs") or []:
        (where / name).mkdir(parents=True, exist_ok=True)


def _run_in_process(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # a traceback is exactly what the corpus forbids
            traceback.print_exc(file=err)
            code = -1
    return code, out.getvalue(), err.getvalue()


def _run_subprocess(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.main", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(HERE.parents[2]))},
    )
    return proc.returncode, proc.stdout, proc.stderr


def run_case(path: Path, where: Path) -> tuple[dict[str, Any], int, str, str]:
    case = _case(path)
    _materialise(case, where)
    argv = [str(a) for a in case["argv"]]
    cwd = os.getcwd()
    os.chdir(where)
    try:
        if case.get("subprocess"):
            code, out, err = _run_subprocess(argv, where)
        else:
            code, out, err = _run_in_process(argv)
    finally:
        os.chdir(cwd)
    return case, code, out, err


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 150


@pytest.mark.parametrize("path", CASES, ids=[str(p.relative_to(HERE / "cases")) for p in CASES])
def test_case(path: Path, tmp_path: Path) -> None:
    case, code, out, err = run_case(path, tmp_path)
    expect = case["expect"]
    assert "Traceback" not in err + out, err[-3000:]
    shown = f"exit {code}\nstdout: {out[-1500:]}\nstderr: {err[-1500:]}"
    assert code == expect.get("exit", 2), shown
    if expect.get("exit", 2) == 2:
        # The error is one line; notes and warnings about input left out may stand beside it.
        lines = [
            ln
            for ln in err.splitlines()
            if ln.strip() and not ln.startswith(("note:", "warning:"))
        ]
        assert len(lines) == 1, f"expected one line, got:\n{err}"
        assert expect["stderr"] in lines[0], lines[0]
        assert "missing 0.0 GiB" not in lines[0]
    else:  # accepted input (e.g. 16e9 read as a number), or ignored with a warning
        assert expect.get("stdout", "") in out, out[-3000:]
        assert expect.get("stderr", "") in err, err[-3000:]
    assert expect.get("warning", "") in err, err[-3000:]
    for name in expect.get("absent", []):
        assert not (tmp_path / name).exists(), f"{name} was left behind"

"""`orchestrator profiles import`: what it writes; bad input exits 2, one line, no files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.spec.profiles import ProfileSet

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAILOR = str(FIXTURES / "sailor")
CEPHALO = str(FIXTURES / "cephalo")


def test_sailor_import_writes_one_file_per_device(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "profiles",
            "import",
            "--format",
            "sailor",
            SAILOR,
            "--out",
            str(out),
            "--num-layers",
            "2",
            "--sequence-length",
            "2048",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert written == ["TINY/A100-40.json", "TINY/V100-16.json"]
    assert "wrote 2 profile(s)" in captured.out and "TINY/A100-40.json" in captured.out
    assert "XPU-9" in captured.err  # the skipped GPU folder is named in a warning
    profiles = ProfileSet.load([out])
    assert profiles.lookup("A100-40", 2, 2) is not None
    assert not list(out.rglob("*.tmp"))  # no temporary files left behind


def test_cephalo_import_is_deterministic(tmp_path: Path, capsys) -> None:
    args = [
        "profiles",
        "import",
        "--format",
        "cephalo",
        CEPHALO,
        "--model",
        "tinygpt",
        "--name",
        "Tiny",
        "--sequence-length",
        "512",
        "--dtype",
        "fp32",
        "--microbatch-sizes",
        "1,2,4",
    ]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    files_a = sorted((tmp_path / "a").rglob("*.json"))
    assert len(files_a) == 6
    for f in files_a:
        twin = tmp_path / "b" / f.relative_to(tmp_path / "a")
        assert f.read_bytes() == twin.read_bytes()
    h100 = json.loads((tmp_path / "a" / "Tiny" / "H100.json").read_text())
    assert [e["microbatch_size"] for e in h100["entries"]] == [1, 2, 4]


BAD = [
    (["--format", "csv", SAILOR], "--format"),
    (["--format", "sailor", "/no/such/folder"], "SRC"),
    (
        [
            "--format",
            "cephalo",
            CEPHALO,
            "--model",
            "tinygpt",
            "--sequence-length",
            "512",
            "--dtype",
            "fp32",
            "--gpus",
            "mi250",
        ],
        "--gpus",
    ),
    (["--format", "sailor", SAILOR, "--gpus", "A100-40,XPU-9"], "--gpus"),
    (["--format", "sailor", SAILOR, "--microbatch-sizes", "1,0"], "--microbatch-sizes"),
    (["--format", "sailor", SAILOR, "--microbatch-sizes", "two"], "--microbatch-sizes"),
    (["--format", "sailor", SAILOR, "--microbatch-sizes", "1,,2"], "--microbatch-sizes"),
    (["--format", "sailor", SAILOR, "--num-layers", "-2"], "--num-layers"),
    (["--format", "sailor", SAILOR, "--num-layers", "3"], "--num-layers"),
    (["--format", "sailor", SAILOR, "--sequence-length", "1.5"], "--sequence-length"),
    (["--format", "sailor", SAILOR, "--dtype", "fp8"], "--dtype"),
    (["--format", "sailor", SAILOR, "--name", " "], "--name"),
    (["--format", "cephalo", CEPHALO, "--sequence-length", "512", "--dtype", "fp32"], "--model"),
    (
        ["--format", "cephalo", CEPHALO, "--model", "tinygpt", "--dtype", "fp32"],
        "--sequence-length",
    ),
    (
        [
            "--format",
            "cephalo",
            CEPHALO,
            "--model",
            "tinygpt",
            "--sequence-length",
            "512",
            "--dtype",
            "bf16",
        ],
        "--sequence-length/--dtype",
    ),
]


@pytest.mark.parametrize(("args", "field"), BAD)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    args: list[str], field: str, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    code = main(["profiles", "import", *args, "--out", str(out)])
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if not line.startswith("warning:")]
    assert code == 2
    assert len(errors) == 1, captured.err
    assert errors[0].startswith("orchestrator profiles: error: ")
    assert f"{field}:" in errors[0] and "fix:" in errors[0]
    assert "Traceback" not in captured.err
    assert not out.exists()


def test_out_that_is_a_file(tmp_path: Path, capsys) -> None:
    target = tmp_path / "file"
    target.write_text("keep me")
    code = main(["profiles", "import", "--format", "sailor", SAILOR, "--out", str(target)])
    assert code == 2 and "--out" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_the_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    """The real entry point in a child process: exit code 2 and a single stderr line."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli.main",
            "profiles",
            "import",
            "--format",
            "nope",
            SAILOR,
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--format" in proc.stderr

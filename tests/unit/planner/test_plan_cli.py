"""`orchestrator plan` and `orchestrator estimate` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.main import main

ROOT = Path(__file__).parents[3]
CLUSTER = ROOT / "examples/planner/mixed-a100-t4.yaml"
MODEL = ROOT / "examples/planner/opt-350.yaml"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_plan_json_has_the_documented_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    pic = tmp_path / "plan.png"
    code = main(
        [
            "plan",
            "--cluster",
            str(CLUSTER),
            "--model",
            str(MODEL),
            "--json",
            "--out",
            str(out),
            "--picture",
            str(pic),
        ]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("plan", "estimate", "bound", "baselines", "search_time_s"):
        assert key in doc
    assert set(doc["estimate"]) >= {"step_time_s", "throughput_samples_per_s", "peak_memory_bytes"}
    assert set(doc["baselines"]) == {"uniform_data_parallel", "fastest_type_only"}
    assert doc["estimate"]["step_time_s"] >= doc["bound"]["step_time_s"]
    assert json.loads(out.read_text()) == doc["plan"]
    assert pic.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # estimate re-costs the written plan to the same step time.
    code = main(
        ["estimate", "--plan", str(out), "--cluster", str(CLUSTER), "--model", str(MODEL), "--json"]
    )
    assert code == 0
    est = json.loads(capsys.readouterr().out)
    assert est["fits"] is True
    assert est["step_time_s"] == pytest.approx(doc["estimate"]["step_time_s"])
    assert len(est["devices"]) == sum(len(r["stages"]) for r in doc["plan"]["replicas"])


def test_plan_table_mentions_baselines_and_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--cluster", str(CLUSTER), "--model", str(MODEL)]) == 0
    text = capsys.readouterr().out
    assert "fluid bound" in text and "uniform data parallel" in text and "fastest type only" in text


@pytest.mark.parametrize(
    ("cluster_text", "expect"),
    [
        (
            "node_groups:\n  - {name: a, device_type: A100X, num_nodes: 1, devices_per_node: 1}\n",
            "node_groups[0].device_type",
        ),
        (
            "node_groups:\n  - {name: a, device_type: L4, num_nodes: 0, devices_per_node: 1}\n",
            "node_groups[0].num_nodes",
        ),
        ("node_groups: [\n", "not valid YAML"),
        (
            "node_groups:\n  - {name: a, device_type: L4, num_nodes: 1, devices_per_node: 1, x: 1}",
            "unknown field",
        ),
    ],
)
def test_bad_cluster_is_one_line_exit_2(tmp_path: Path, cluster_text: str, expect: str) -> None:
    cluster = _write(tmp_path, "c.yaml", cluster_text)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli.main",
            "plan",
            "--cluster",
            str(cluster),
            "--model",
            str(MODEL),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert expect in done.stderr


def test_infeasible_and_mismatched_plans_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = _write(
        tmp_path,
        "tiny.yaml",
        "node_groups:\n  - {name: t, device_type: RTX-2080, num_nodes: 1, devices_per_node: 1}\n",
    )
    big = _write(
        tmp_path,
        "big.yaml",
        "name: big\nnum_layers: 8\nhidden_size: 8192\nnum_heads: 64\n"
        "sequence_length: 2048\nvocab_size: 50000\n",
    )
    assert main(["plan", "--cluster", str(tiny), "--model", str(big)]) == 2
    err = capsys.readouterr().err
    assert "RTX-2080" in err and "missing" in err

    # A plan for more layers than the model has, and one needing devices the cluster lacks.
    plan = {
        "global_batch_size": 2,
        "microbatch_size": 1,
        "replicas": [{"batch_size": 2, "stages": [{"layers": [0, 5], "device_type": "T4"}]}],
    }
    p = _write(tmp_path, "p.json", json.dumps(plan))
    assert (
        main(["estimate", "--plan", str(p), "--cluster", str(CLUSTER), "--model", str(MODEL)]) == 2
    )
    assert "planner layers" in capsys.readouterr().err
    plan["replicas"][0]["stages"][0] = {"layers": [0, 26], "device_type": "H100"}
    p.write_text(json.dumps(plan))
    assert (
        main(["estimate", "--plan", str(p), "--cluster", str(CLUSTER), "--model", str(MODEL)]) == 2
    )
    assert "H100" in capsys.readouterr().err
    # Batch shares that do not add up.
    plan["replicas"][0] = {"batch_size": 3, "stages": [{"layers": [0, 26], "device_type": "T4"}]}
    p.write_text(json.dumps(plan))
    assert (
        main(["estimate", "--plan", str(p), "--cluster", str(CLUSTER), "--model", str(MODEL)]) == 2
    )
    assert "add up" in capsys.readouterr().err


def test_picture_rejects_unknown_suffix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--cluster",
            str(CLUSTER),
            "--model",
            str(MODEL),
            "--picture",
            str(tmp_path / "p.gif"),
        ]
    )
    assert code == 2
    assert "--picture" in capsys.readouterr().err
    assert not (tmp_path / "p.gif").exists()

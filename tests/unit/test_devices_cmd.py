"""`orchestrator devices`: the catalog as a table and as JSON, with a cluster file's own types."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cli.main import main
from orchestrator.spec.devices import GiB

REQUIRED = [
    "H200",
    "H100",
    "GH-96",
    "A100-80",
    "A100-40",
    "L40S",
    "A10G",
    "A6000",
    "L4",
    "T4",
    "V100-32",
    "V100-16",
    "RTX-3090",
    "RTX-2080",
    "Titan-RTX",
    "P40",
    "cpu",
]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "planner"


def run_json(capsys, *extra: str) -> list[dict]:
    assert main(["devices", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_table_lists_every_required_type(capsys) -> None:
    assert main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines[1:] if line and not line.startswith("Peak")]
    assert names == REQUIRED  # catalog order
    assert lines[0].split()[:3] == ["name", "memory", "GiB"]
    t4 = next(line for line in lines if line.startswith("T4 "))
    # T4: 16 GiB, 8.1 TFLOP/s fp32, 65 fp16 (tensor cores), no bf16 so the fp32 rate
    assert t4.split()[1:5] == ["16.0", "8.1", "65", "8.1"]


def test_json_has_units_in_keys(capsys) -> None:
    rows = run_json(capsys)
    assert [r["name"] for r in rows] == REQUIRED
    a100 = next(r for r in rows if r["name"] == "A100-80")
    assert a100["memory_bytes"] == 80 * 1000**3
    assert a100["peak_flops_per_s"]["bf16"] == 312e12
    assert a100["intra_node_bandwidth_bytes_per_s"] > 0
    assert all(r["source"] == "built-in" for r in rows)


def test_cluster_file_adds_and_overrides_types(tmp_path: Path, capsys) -> None:
    rows = run_json(capsys, "--cluster", str(EXAMPLES / "custom-device.yaml"))
    p100 = next(r for r in rows if r["name"] == "P100")
    assert p100["source"] == "cluster file" and p100["memory_bytes"] == 16 * GiB
    override = tmp_path / "c.yaml"
    override.write_text(
        "device_types:\n"
        "  - {name: T4, memory_bytes: 4000000000, peak_flops_per_s: {fp32: 1.0e+12},\n"
        "     memory_bandwidth_bytes_per_s: 1.0e+9, intra_node_bandwidth_bytes_per_s: 1.0e+9}\n"
        "node_groups: [{name: g, device_type: T4, num_nodes: 1, devices_per_node: 1}]\n"
    )
    rows = run_json(capsys, "--cluster", str(override))
    t4 = next(r for r in rows if r["name"] == "T4")
    assert (t4["memory_bytes"], t4["source"]) == (4_000_000_000, "cluster file (overrides)")
    # no fp16/bf16 rate given: the fp32 rate stands in for them
    assert t4["peak_flops_per_s"]["bf16"] == 1e12


def test_every_example_cluster_is_valid(capsys) -> None:
    clusters = [p for p in EXAMPLES.glob("*.yaml") if "node_groups" in p.read_text()]
    assert len(clusters) >= 4
    for path in clusters:
        assert main(["devices", "--cluster", str(path)]) == 0, path
    capsys.readouterr()

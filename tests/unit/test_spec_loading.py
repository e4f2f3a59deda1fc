"""Bad spec files: one line naming the file, the field and the fix; exit code 2 at the CLI.

Cluster files go through `orchestrator devices --cluster` (the real command); model, training and
plan files through the loaders the `plan` and `estimate` commands use, which raise SpecError (the
CLI turns it into exit code 2, checked here with the cluster files).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.errors import SpecError
from orchestrator.spec.loading import load_cluster, load_model, load_plan, load_training

GROUP = "node_groups: [{name: g, device_type: A100-80, num_nodes: 1, devices_per_node: 8}]\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


CLUSTER_CASES = [
    ("invalid YAML", "node_groups: [{name: g,\n", "not valid YAML/JSON"),
    ("unknown field", GROUP + "netwrk: {}\n", "netwrk: unknown field"),
    (
        "unknown device type",
        "node_groups: [{name: g, device_type: B300, num_nodes: 1, devices_per_node: 8}]\n",
        "node_groups[0].device_type: unknown device type 'B300'",
    ),
    (
        "zero nodes",
        "node_groups: [{name: g, device_type: T4, num_nodes: 0, devices_per_node: 8}]\n",
        "node_groups[0].num_nodes",
    ),
    (
        "negative devices",
        "node_groups: [{name: g, device_type: T4, num_nodes: 1, devices_per_node: -4}]\n",
        "node_groups[0].devices_per_node",
    ),
    (
        "negative bandwidth",
        GROUP + "network: {inter_node_bandwidth_bytes_per_s: -1}\n",
        "network.inter_node_bandwidth_bytes_per_s",
    ),
    (
        "missing field",
        "node_groups: [{name: g, device_type: T4, num_nodes: 1}]\n",
        "node_groups[0].devices_per_node: required field is missing",
    ),
    ("not a mapping", "- just\n- a list\n", "expected a mapping"),
]


@pytest.mark.parametrize(
    ("case", "text", "expected"), CLUSTER_CASES, ids=[c[0] for c in CLUSTER_CASES]
)
def test_bad_cluster_file_exits_2_with_one_line(
    case: str, text: str, expected: str, tmp_path: Path, capsys
) -> None:
    path = write(tmp_path, "cluster.yaml", text)
    code = main(["devices", "--cluster", str(path)])
    err = capsys.readouterr().err
    assert code == 2, case
    assert err.count("\n") == 1 and "Traceback" not in err
    assert expected in err
    assert str(path) in err or "unknown device type" in err


def test_unknown_device_type_names_the_fix(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", GROUP.replace("A100-80", "A100"))
    with pytest.raises(SpecError) as err:
        load_cluster(path).resolve()
    assert err.value.field == "node_groups[0].device_type"
    assert "orchestrator devices" in (err.value.fix or "") and "A100-80" in (err.value.fix or "")


def test_missing_file(tmp_path: Path, capsys) -> None:
    assert main(["devices", "--cluster", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


MODEL = (
    "name: m\nnum_layers: 2\nhidden_size: 64\nnum_heads: 4\nsequence_length: 32\nvocab_size: 100\n"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MODEL.replace("num_layers: 2", "num_layers: 0"), "num_layers"),
        (MODEL.replace("hidden_size: 64", "hidden_size: -64"), "hidden_size"),
        (MODEL + "dtype: fp8\n", "dtype"),
        (MODEL + "layers: 3\n", "layers: unknown field"),
        (MODEL.replace("num_heads: 4", "num_heads: 5"), "divisible by num_heads"),
        ("name: m\nnum_layers: [2\n", "not valid YAML/JSON"),
    ],
)
def test_bad_model_file(text: str, expected: str, tmp_path: Path) -> None:
    path = write(tmp_path, "model.yaml", text)
    with pytest.raises(SpecError, match=expected.replace("[", r"\[")) as err:
        load_model(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("global_batch_size: 0\n", "global_batch_size"),
        ("microbatch_sizes: [0]\n", "microbatch_sizes[0]"),
        ("microbatch_sizes: []\n", "microbatch_sizes"),
        ("optimizer: lamb\n", "optimizer"),
        ("global_batch_size: 4\nmicrobatch_sizes: [8]\n", "exceeds global_batch_size"),
    ],
)
def test_bad_training_file(text: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=expected.replace("[", r"\[")):
        load_training(write(tmp_path, "training.yaml", text))


def test_training_defaults_without_a_file() -> None:
    assert load_training(None).global_batch_size == 64


PLAN = (
    '{"global_batch_size": 8, "microbatch_size": 2, "replicas": ['
    '{"batch_size": 8, "stages": [{"layers": [0, 2], "device_type": "T4"},'
    ' {"layers": [2, 4], "device_type": "T4"}]}]}'
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PLAN.replace('"batch_size": 8,', '"batch_size": 6,'), "add up"),
        (PLAN.replace("[2, 4]", "[3, 4]"), "contiguously"),
        (PLAN.replace('"microbatch_size": 2', '"microbatch_size": 0'), "microbatch_size"),
        (PLAN.replace('"layers": [0, 2]', '"layers": [0, 0]'), "empty"),
        (PLAN[:-3], "not valid YAML/JSON"),
    ],
)
def test_bad_plan_file(text: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=expected):
        load_plan(write(tmp_path, "plan.json", text))


def test_good_plan_loads(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, "plan.json", PLAN))
    assert plan.num_layers == 4 and plan.device_counts() == {"T4": 2}

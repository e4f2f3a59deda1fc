"""A plan never mixes CPU (gloo) and GPU (NCCL) ranks: the planner sees one kind of node, and a
hand-written plan with stages on both is refused in one line."""

from __future__ import annotations

import pytest

from orchestrator.errors import SpecError
from orchestrator.runtime.discovery import check_one_backend, nodes_from_rows, one_backend
from orchestrator.spec.plan import Plan


def _row(node_id: str, gpus: int = 0, cpus: int = 2, **labels: str) -> dict:
    resources = {"CPU": float(cpus)} | ({"GPU": float(gpus)} if gpus else {})
    return {
        "NodeID": node_id,
        "Alive": True,
        "NodeManagerAddress": "10.0.0.1",
        "Resources": resources,
        "Labels": labels,
    }


MIXED = [
    _row("g", gpus=2, **{"orchestrator.io/device-type": "A100-80"}),
    _row("head", cpus=8),
]


def _plan(*types: str) -> Plan:
    stages = [{"layers": [i, i + 1], "device_type": t} for i, t in enumerate(types)]
    return Plan.model_validate(
        {
            "global_batch_size": 2,
            "microbatch_size": 1,
            "replicas": [{"batch_size": 2, "stages": stages}],
        }
    )


def test_mixed_cluster_plans_on_the_gpu_nodes_and_says_so() -> None:
    nodes = nodes_from_rows(MIXED)
    kept, note = one_backend(nodes)
    assert [n.device_type for n in kept] == ["A100-80"]
    assert note is not None
    assert "GPU nodes only" in note and "cpu-0" in note and "gloo" in note and "NCCL" in note


def test_one_kind_of_node_is_kept_whole_without_a_note() -> None:
    cpu_only = nodes_from_rows([_row("a", cpus=4), _row("b", cpus=4)])
    assert one_backend(cpu_only) == (cpu_only, None)
    gpu_only = nodes_from_rows(MIXED[:1])
    assert one_backend(gpu_only) == (gpu_only, None)


def test_plan_with_cpu_and_gpu_stages_is_refused_naming_the_fix() -> None:
    nodes = nodes_from_rows(MIXED)
    with pytest.raises(SpecError) as err:
        check_one_backend(_plan("cpu", "A100-80"), nodes)
    text = str(err.value)
    assert "gloo" in text and "NCCL" in text and "drop the cpu stages" in text
    assert "\n" not in text
    check_one_backend(_plan("A100-80", "A100-80"), nodes)  # one kind: accepted

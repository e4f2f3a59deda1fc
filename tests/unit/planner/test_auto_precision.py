"""``training.precision: auto``: the planner picks the format, costs it, and the plan records it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.cli.main import main
from orchestrator.control.planning import MakePlanPlanner
from orchestrator.costmodel import estimate_plan
from orchestrator.errors import SpecError
from orchestrator.planner import make_plan
from orchestrator.planner.precision import fast_formats
from orchestrator.spec.cluster import Cluster, ClusterSpec
from orchestrator.spec.devices import Dtype
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan
from orchestrator.spec.snapshot import ClusterSnapshot, NodeInfo

MODEL = ModelSpec(
    name="small",
    num_layers=4,
    hidden_size=256,
    num_heads=4,
    sequence_length=128,
    vocab_size=1000,
    dtype=Dtype.BF16,
)
AUTO = TrainingSpec(global_batch_size=32, microbatch_sizes=[2, 4], precision="auto")


def _cluster(*groups: tuple[str, int]) -> Cluster:
    return ClusterSpec.model_validate(
        {
            "node_groups": [
                {"name": f"g{i}", "device_type": t, "num_nodes": n, "devices_per_node": 2}
                for i, (t, n) in enumerate(groups)
            ]
        }
    ).resolve()


def _types_used(plan: Plan, cluster: Cluster) -> list:  # type: ignore[type-arg]
    return [cluster.device_types[t] for t in plan.device_counts()]


def test_auto_is_a_training_setting_that_names_no_format_until_planned() -> None:
    assert AUTO.precision == "auto" and AUTO.explicit_precision is None
    assert AUTO.runtime_precision is Dtype.FP32  # only when a plan does not say
    assert TrainingSpec(precision="fp16").explicit_precision is Dtype.FP16
    with pytest.raises(ValidationError, match="mixed_precision: false contradicts"):
        TrainingSpec(precision="auto", mixed_precision=False)
    with pytest.raises(ValidationError):
        TrainingSpec(precision="fp8")


@pytest.mark.parametrize(
    ("groups", "chosen"),
    [
        ((("A100-80", 1), ("H100", 1)), Dtype.BF16),  # every type runs bf16 fast
        ((("V100-32", 1), ("T4", 1)), Dtype.FP16),  # no bf16 tensor cores on either
        ((("P40", 2),), Dtype.FP32),  # no fast 16-bit format at all
    ],
)
def test_auto_takes_the_format_every_planned_type_runs_fast(groups, chosen) -> None:  # type: ignore[no-untyped-def]
    cluster = _cluster(*groups)
    result = make_plan(cluster, MODEL, AUTO)
    assert result.plan.precision is chosen
    decision = result.precision_choice
    assert decision is not None and decision.precision is chosen
    assert decision.reason.startswith(str(chosen))
    for device in _types_used(result.plan, cluster):
        assert chosen is Dtype.FP32 or chosen in fast_formats(device), device.name
    # The chosen format's plan is the fastest of the candidates (ties go to bf16, fp16, fp32).
    times = [c.step_time_s for c in decision.candidates if c.step_time_s is not None]
    assert result.estimate.step_time_s == min(times)


def test_auto_leaves_out_the_types_that_do_not_run_the_chosen_format_fast() -> None:
    cluster = _cluster(("A100-80", 1), ("P40", 2))
    result = make_plan(cluster, MODEL, AUTO)
    decision = result.precision_choice
    assert decision is not None
    by_format = {c.precision: c for c in decision.candidates}
    # P40 runs no 16-bit format fast: both 16-bit candidates plan without it.
    assert by_format[Dtype.BF16].excluded == ("P40",) and by_format[Dtype.FP16].excluded == ("P40",)
    assert by_format[Dtype.FP32].excluded == ()
    fp32_s, bf16_s = by_format[Dtype.FP32].step_time_s, by_format[Dtype.BF16].step_time_s
    assert fp32_s is not None and bf16_s is not None
    # An A100 in bf16 outruns the A100 and two P40 nodes in fp32 (catalog: 312 vs 19.5 TFLOP/s).
    assert bf16_s < fp32_s
    assert result.plan.precision is Dtype.BF16 and "P40" not in result.plan.device_counts()
    assert "leaving out P40" in decision.reason and "fp32" in decision.reason


def test_the_plan_is_costed_in_its_format() -> None:
    cluster = _cluster(("A100-80", 1))
    result = make_plan(cluster, MODEL, AUTO)
    plan = result.plan
    assert plan.precision is Dtype.BF16
    # `estimate` of the written plan costs the same format: the same figures as the search.
    again = estimate_plan(Plan.model_validate_json(plan.to_json()), cluster, MODEL, AUTO)
    assert again.step_time_s == pytest.approx(result.estimate.step_time_s, rel=1e-12)
    # The same layout recorded as fp32 is costed at the fp32 rate and fp32 state bytes.
    fp32 = estimate_plan(plan.model_copy(update={"precision": Dtype.FP32}), cluster, MODEL, AUTO)
    assert fp32.step_time_s > 1.5 * again.step_time_s
    assert fp32.peak_memory_bytes > again.peak_memory_bytes


def test_an_explicit_precision_is_recorded_and_costed() -> None:
    cluster = _cluster(("A100-80", 1))
    fp32 = TrainingSpec(global_batch_size=32, microbatch_sizes=[2, 4], precision="fp32")
    result = make_plan(cluster, MODEL, fp32)
    assert result.plan.precision is Dtype.FP32 and result.precision_choice is None
    bf16 = make_plan(cluster, MODEL, fp32.model_copy(update={"precision": Dtype.BF16}))
    # The model says bf16, but an fp32 run is costed at the fp32 rate.
    assert result.estimate.step_time_s > 1.5 * bf16.estimate.step_time_s
    # Unset: no format recorded, so the plan keeps its bytes.
    unset = make_plan(cluster, MODEL, TrainingSpec(global_batch_size=32, microbatch_sizes=[2, 4]))
    assert unset.plan.precision is None and "precision" not in json.loads(unset.plan.to_json())


def test_a_plan_refuses_a_training_precision_that_names_another_format() -> None:
    plan = make_plan(_cluster(("A100-80", 1)), MODEL, AUTO).plan
    plan.check_precision(None)
    plan.check_precision(Dtype.BF16)
    with pytest.raises(SpecError, match=r"plan's precision \(bf16\) contradicts"):
        plan.check_precision(Dtype.FP16)


def test_the_controller_keeps_the_first_plans_format_for_the_run() -> None:
    planner = MakePlanPlanner(MODEL, AUTO)
    a100 = ClusterSnapshot.of(1, [NodeInfo("n-a", "A100-80", 2)])
    first = planner(a100, {})
    assert first.plan.precision is Dtype.BF16
    assert planner.training.precision is Dtype.BF16
    # Four T4 nodes join: planned afresh, auto would switch to fp16 to use them.
    t4s = [NodeInfo(f"n-t{i}", "T4", 2) for i in range(4)]
    joined = ClusterSnapshot.of(2, [NodeInfo("n-a", "A100-80", 2), *t4s])
    assert make_plan(joined.to_cluster(), MODEL, AUTO).plan.precision is Dtype.FP16
    # The run stays in bf16.
    assert planner(joined, {}).plan.precision is Dtype.BF16


def _write(tmp_path: Path, groups: str, training: str) -> list[str]:
    (tmp_path / "c.yaml").write_text(f"node_groups:\n{groups}")
    (tmp_path / "m.yaml").write_text(
        "name: small\nnum_layers: 4\nhidden_size: 256\nnum_heads: 4\nsequence_length: 128\n"
        "vocab_size: 1000\ndtype: bf16\n"
    )
    (tmp_path / "t.yaml").write_text(training)
    return ["--cluster", str(tmp_path / "c.yaml"), "--model", str(tmp_path / "m.yaml")]


def test_plan_and_estimate_commands_say_and_keep_the_format(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    common = _write(
        tmp_path,
        "  - {name: v, device_type: V100-32, num_nodes: 1, devices_per_node: 2}\n",
        "global_batch_size: 32\nmicrobatch_sizes: [2, 4]\nprecision: auto\n",
    )
    out = tmp_path / "plan.json"
    training = ["--training", str(tmp_path / "t.yaml")]
    capsys.readouterr()
    assert main(["plan", *common, *training, "--out", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["precision_auto"]["chosen"] == "fp16"
    assert "bf16" in shown["precision_auto"]["candidates"]
    assert shown["precision"]["planned"] == "fp16" and shown["precision"]["warning"] is None
    assert json.loads(out.read_text())["precision"] == "fp16"
    assert main(["estimate", *common, *training, "--plan", str(out), "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["precision"] == "fp16"
    assert est["step_time_s"] == pytest.approx(shown["estimate"]["step_time_s"], rel=1e-12)
    (tmp_path / "t.yaml").write_text("global_batch_size: 32\nprecision: bf16\n")
    assert main(["estimate", *common, *training, "--plan", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "plan.precision" in err and "contradicts" in err


def test_a_plan_without_precision_run_under_auto_takes_its_layouts_format() -> None:
    from orchestrator.planner.auto_precision import with_auto_precision

    cluster = _cluster(("V100-32", 1), ("A100-80", 1))
    unset = TrainingSpec(global_batch_size=32, microbatch_sizes=[2, 4])
    layout = make_plan(cluster, MODEL, unset).plan
    assert layout.precision is None
    types = cluster.device_types
    v100_only = layout.model_copy(
        update={
            "replicas": tuple(
                r.model_copy(
                    update={
                        "stages": tuple(
                            s.model_copy(update={"device_type": "V100-32", "node": None})
                            for s in r.stages
                        )
                    }
                )
                for r in layout.replicas
            )
        }
    )
    assert with_auto_precision(v100_only, AUTO, types).precision is Dtype.FP16
    assert with_auto_precision(v100_only, unset, types).precision is None
    recorded = v100_only.model_copy(update={"precision": Dtype.FP32})
    assert with_auto_precision(recorded, AUTO, types).precision is Dtype.FP32
    assert with_auto_precision(v100_only, AUTO, {}).precision is None  # unknown types: unchanged

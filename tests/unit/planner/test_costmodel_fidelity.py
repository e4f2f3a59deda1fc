"""Cost-model terms that measured runs showed wrong: each test fails on the old arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.costmodel import CostTables, estimate_plan, estimate_with_tables, network
from orchestrator.costmodel.presets import MEGATRON_DEEPSPEED, ORCHESTRATOR, runtime_preset
from orchestrator.costmodel.validation import error_summary, load_runs, predict_runs
from orchestrator.profiles.builtin import builtin_model, builtin_profiles
from orchestrator.spec import Plan
from orchestrator.spec.cluster import Cluster, Node
from orchestrator.spec.devices import DeviceCatalog

from .toy import GiB, cluster, model, profiles, training

VALIDATION = (
    Path(__file__).resolve().parents[2]
    / "fixtures"
    / "validation"
    / "sailor-gh200-gpt-neo-2.7.json"
)


def _plan(batch: int, stages: list[tuple[int, int, str, int, str | None]], replicas: int = 1):
    return Plan(
        global_batch_size=batch,
        microbatch_size=1,
        replicas=[
            {
                "batch_size": batch // replicas,
                "stages": [
                    {"layers": [s, e], "device_type": t, "tp": tp, "node": node}
                    for s, e, t, tp, node in stages
                ],
            }
            for _ in range(replicas)
        ],
    )


def _gh_cluster(
    nodes: int, gpus: int = 4, network_bytes_per_s: float = 100e9, name: str = "GH-96"
) -> Cluster:
    device = DeviceCatalog.builtin()[name]
    return Cluster(
        nodes=tuple(
            Node(
                f"n{i}",
                name,
                device,
                gpus,
                device.intra_node_bandwidth_bytes_per_s,
                network_bytes_per_s,
            )
            for i in range(nodes)
        )
    )


def test_a_stage_update_is_charged_once_not_per_layer() -> None:
    # OPT-350 on A100-40 (Sailor, mbs 1, tp 1): the stage's optimizer step is 0.002938 s; a stage
    # of 26 layers once charged 26 x 0.002938 = 0.0764 s.
    opt = builtin_model("OPT-350")
    c = Cluster(nodes=(Node.from_device("a", DeviceCatalog.builtin()["A100-40"], 2),))
    plan = _plan(2, [(0, 13, "A100-40", 1, "a"), (13, 26, "A100-40", 1, "a")])
    est = estimate_plan(plan, c, opt, training(2), builtin_profiles("OPT-350"))
    assert [d.update_s for d in est.devices] == pytest.approx([0.002938, 0.002938])


def test_activation_memory_is_megatrons_not_two_bytes_per_sailor_unit() -> None:
    # Sailor's llm_info counts 60,563,456 activation numbers per sample for a GPT-Neo-2.7 block at
    # tp 4; the measured runs rise by ~4.2 B per unit there. 2 B per unit was half of it.
    neo = builtin_model("GPT-Neo-2.7")
    catalog = DeviceCatalog.builtin()
    devices = {"A100-40": catalog["A100-40"]}
    tables = CostTables(neo, training(8, (4,)), devices, builtin_profiles("GPT-Neo-2.7"))
    table = tables.table("A100-40", 4, 4)
    per_unit = table.activation_bytes(1, 2) / (60_563_456 * 4)
    assert 4.0 <= per_unit <= 4.5


def test_peak_memory_includes_the_framework_footprint() -> None:
    # The toy's device has no overhead; give one 2 GiB and the peak must rise by exactly that.
    spec = cluster(("fast", 1, 1))
    c = spec.resolve()
    dev = c.nodes[0].device_type.model_copy(update={"framework_overhead_bytes": 2 * GiB})
    c2 = Cluster(nodes=(Node("x", "fast", dev, 1, 1e30, 1e30),))
    plan = _plan(1, [(0, 4, "fast", 1, None)])
    base = estimate_plan(plan, c, model(2), training(1), profiles({"fast": 1.0}, 4))
    with_fw = estimate_plan(plan, c2, model(2), training(1), profiles({"fast": 1.0}, 4))
    assert with_fw.peak_memory_bytes == pytest.approx(base.peak_memory_bytes + 2 * GiB)
    assert with_fw.devices[0].memory_capacity_bytes == dev.memory_bytes  # the whole device


def test_runtime_presets_carry_their_training_state_and_footprint() -> None:
    neo = builtin_model("GPT-Neo-2.7")
    tr = training(8, (1,))
    device = DeviceCatalog.builtin()["GH-96"]
    assert ORCHESTRATOR.state_bytes(neo, tr) == 16  # mixed-precision Adam, ZeRO's figure
    assert ORCHESTRATOR.framework_overhead_bytes(device) == device.framework_overhead_bytes
    assert MEGATRON_DEEPSPEED.state_bytes(neo, tr) == 24
    assert MEGATRON_DEEPSPEED.framework_overhead_bytes(device) == 4 * GiB
    assert runtime_preset("megatron-deepspeed") is MEGATRON_DEEPSPEED
    with pytest.raises(ValueError, match="orchestrator"):
        runtime_preset("nope")
    # Same plan, two runtimes: state 24/16 of ours, plus the larger footprint.
    c = _gh_cluster(1)
    plan = _plan(1, [(0, 34, "GH-96", 1, "n0")])
    ours = estimate_plan(plan, c, neo, tr)
    tables = CostTables.for_cluster(neo, tr, c, runtime=MEGATRON_DEEPSPEED)
    theirs = estimate_with_tables(plan, c, tables)
    state = neo.total_params
    diff = theirs.peak_memory_bytes - ours.peak_memory_bytes
    assert diff == pytest.approx(8 * state + 4 * GiB - device.framework_overhead_bytes, rel=1e-6)


def test_cross_node_boundary_under_tp_sends_a_slice_per_rank() -> None:
    # Two stages on two nodes, tp 4: each rank sends 1/4 of the activation, so the boundary's
    # network time is a quarter of the tp-1 figure (the all-gather inside the node is extra, small).
    # H100: no measured network fit, so the configured bandwidth applies as is.
    neo = builtin_model("GPT-Neo-2.7")
    tr = training(1, (1,))
    c = _gh_cluster(2, network_bytes_per_s=1e9, name="H100")  # slow network: the p2p dominates
    tp1 = _plan(1, [(0, 17, "H100", 1, "n0"), (17, 34, "H100", 1, "n1")])
    tp4 = _plan(1, [(0, 17, "H100", 4, "n0"), (17, 34, "H100", 4, "n1")])
    e1, e4 = estimate_plan(tp1, c, neo, tr), estimate_plan(tp4, c, neo, tr)
    t1 = CostTables.for_cluster(neo, tr, c)
    comm1 = e1.devices[0].microbatch_s - t1.table("H100", 1, 1).compute_s(0, 17)
    comm4 = e4.devices[0].microbatch_s - t1.table("H100", 1, 4).compute_s(0, 17)
    # 2048 x 2560 x 2 B = 10.5 MB over a 0.25 GB/s share: 42 ms at tp 1, ~10.5 ms at tp 4.
    assert comm1 == pytest.approx(0.042, rel=0.1)
    assert comm4 == pytest.approx(comm1 / 4, rel=0.1)


def test_bandwidth_grows_with_message_size_where_measured() -> None:
    # Sailor's GH-96 fit within a node of 4: small messages reach a fraction of the link.
    small = network.intra_node_bandwidth("GH-96", 4, 64e3, 450e9)
    large = network.intra_node_bandwidth("GH-96", 4, 1e9, 450e9)
    assert small < 0.5 * large
    assert large == pytest.approx(250.558e9, rel=1e-3)  # the fit's cap
    # A type Sailor did not measure keeps the nominal figure.
    assert network.intra_node_bandwidth("L4", 4, 64e3, 32e9) == 32e9
    assert network.inter_node_fraction("L4", 4, 64e3) == 1.0
    assert (
        0
        < network.inter_node_fraction("GH-96", 4, 64e3)
        < network.inter_node_fraction("GH-96", 4, 1e9)
        <= 1.0
    )


def test_gradient_allreduce_overlaps_the_last_backward_in_our_runtime_only() -> None:
    neo = builtin_model("GPT-Neo-2.7")
    tr = training(8, (1,))
    c = _gh_cluster(2, network_bytes_per_s=50e9)
    plan = Plan(
        global_batch_size=8,
        microbatch_size=1,
        replicas=[
            {
                "batch_size": 4,
                "stages": [{"layers": [0, 34], "device_type": "GH-96", "tp": 4, "node": f"n{r}"}],
            }
            for r in range(2)
        ],
    )
    ours = estimate_plan(plan, c, neo, tr).devices[0]
    assert 0 < ours.allreduce_s < ours.allreduce_total_s  # part of it hides under the backward
    tables = CostTables.for_cluster(neo, tr, c, runtime=MEGATRON_DEEPSPEED)
    theirs = estimate_with_tables(plan, c, tables).devices[0]
    assert theirs.allreduce_s == pytest.approx(theirs.allreduce_total_s)


def test_cost_model_meets_the_targets_on_the_measured_runs() -> None:
    header, runs = load_runs(VALIDATION)
    preds = predict_runs(
        runs, builtin_model(header["model"]), builtin_profiles(), header["runtime"]
    )
    step_median, step_p90 = error_summary([p.step_error for p in preds])
    memory_median, _ = error_summary([p.memory_error for p in preds])
    assert len(preds) == 12
    assert step_median <= 0.08
    assert step_p90 <= 0.15
    assert memory_median <= 0.08

"""The cost model's memory terms for our runtime: state per term, measured constants, 16-bit
activations, and the terms adding up to the estimate."""

from __future__ import annotations

import pytest

from orchestrator.costmodel import CostTables, estimate_with_tables
from orchestrator.costmodel.memory_terms import memory_terms
from orchestrator.costmodel.presets import MEGATRON_DEEPSPEED, ORCHESTRATOR
from orchestrator.spec import Plan, ProfileFile, ProfileSet, TrainingSpec

from .toy import cluster, model

LAYERS = 4  # embedding, 2 blocks, head


def _training(precision: str | None = None, optimizer: str = "adam") -> TrainingSpec:
    return TrainingSpec(
        global_batch_size=8, microbatch_sizes=[2], optimizer=optimizer, precision=precision
    )


def _profile(
    device_type: str = "a", emulated: bool = False, runtime: dict | None = None
) -> ProfileFile:
    layer = {
        "forward_s": 0.01,
        "backward_s": 0.02,
        "update_s": 0.0,
        "activation_bytes": 1000,
        "activation_bytes_16bit": 700,
        "activation_bytes_16bit_boundary": 500,
    }
    return ProfileFile(
        model="toy",
        device_type=device_type,
        emulated=emulated,
        entries=[{"microbatch_size": 2, "layers": {i: dict(layer) for i in range(LAYERS)}}],
        runtime=runtime,
    )


def _tables(training: TrainingSpec, profiles: ProfileSet, runtime=ORCHESTRATOR) -> CostTables:
    c = cluster(("a", 1, 4)).resolve()
    return CostTables.for_cluster(model(), training, c, profiles, runtime=runtime)


def test_our_runtime_keeps_fp32_state_and_16_bit_weight_copies() -> None:
    m = model()
    fp32 = ORCHESTRATOR.state_terms(m, _training())
    assert (fp32.weights, fp32.grads, fp32.optimizer, fp32.cast_weights) == (4, 4, 8, 0)
    bf16 = ORCHESTRATOR.state_terms(m, _training("bf16"))
    assert (bf16.weights, bf16.grads, bf16.optimizer, bf16.cast_weights) == (4, 4, 8, 2)
    assert ORCHESTRATOR.state_terms(m, _training(optimizer="sgd")).optimizer == 4
    assert ORCHESTRATOR.grad_bytes(m, _training("bf16")) == 4  # fp32 gradients are reduced
    assert MEGATRON_DEEPSPEED.state_terms(m, _training("bf16")).state == 24


def test_measured_constants_are_read_for_our_runtime_only() -> None:
    constants = {"framework_bytes": 123456, "state_bytes_per_param": 17.0, "optimizer": "adam"}
    measured = ProfileSet([_profile(runtime=constants)])
    tables = _tables(_training(), measured)
    assert tables.framework_overhead_bytes("a") == 123456
    assert tables.state_terms("a").state == pytest.approx(17.0)
    # Megatron's constants are its own; another optimizer's measurement does not apply.
    assert _tables(_training(), measured, MEGATRON_DEEPSPEED).framework_overhead_bytes("a") > 1e9
    assert _tables(_training(optimizer="sgd"), measured).state_terms("a").state == 12
    # An emulated profile ran on a CPU: its footprint says nothing of the device type's.
    emulated = ProfileSet([_profile(emulated=True, runtime=constants)])
    assert _tables(_training(), emulated).framework_overhead_bytes("a") == 0  # toy catalog figure
    assert _tables(_training(), emulated).state_terms("a").state == pytest.approx(17.0)


def test_16_bit_plans_use_the_activations_measured_under_autocast() -> None:
    profiles = ProfileSet([_profile()])
    fp32 = _tables(_training(), profiles).table("a", 2, 1)
    assert fp32.activation_bytes(0, 2) == fp32.activation_bytes(1, 3) == 2000
    bf16 = _tables(_training("bf16"), profiles).table("a", 2, 1)
    assert bf16.activation_bytes(0, 2) == 1400  # the embedding's fp32 residual stream
    assert bf16.activation_bytes(1, 3) == 1000  # a later stage receives 16-bit activations


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_terms_add_up_to_the_estimate(precision: str | None) -> None:
    plan = Plan.model_validate(
        {
            "global_batch_size": 8,
            "microbatch_size": 2,
            "replicas": [
                {"batch_size": 4, "stages": [{"layers": [0, 4], "device_type": "a"}]},
                {
                    "batch_size": 4,
                    "stages": [
                        {"layers": [0, 2], "device_type": "a"},
                        {"layers": [2, 4], "device_type": "a"},
                    ],
                },
            ],
        }
    )
    c = cluster(("a", 1, 4)).resolve()
    tables = CostTables.for_cluster(model(), _training(precision), c, ProfileSet([_profile()]))
    estimate = estimate_with_tables(plan, c, tables)
    terms = {(t.replica, t.stage): t for t in memory_terms(plan, tables)}
    assert terms[(1, 0)].microbatches_in_flight == 2 and terms[(0, 0)].microbatches_in_flight == 1
    for d in estimate.devices:
        t = terms[(d.replica, d.stage)]
        assert d.memory_bytes == pytest.approx(t.counted_bytes + t.framework_bytes)
        assert (t.cast_weight_bytes > 0) == (precision == "bf16")

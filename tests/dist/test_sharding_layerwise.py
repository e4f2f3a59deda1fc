"""Fully sharded one-stage replicas run layer by layer (``worker/layerwise.py``): the same
training as one process, with about one layer's whole weights and gradients at the step's peak.

Three holders with batch shares 4:3:1 at microbatch 1 run 4, 3 and 1 rounds of per-layer
gathers and reductions; the two shorter ones run empty rounds up to four.
"""

from __future__ import annotations

import pytest
from dist_cases import TINY_GPT, engine_config, layer_relative_errors, reference_params

from orchestrator.costmodel import CostTables, estimate_with_tables, sharding
from orchestrator.spec.cluster import Cluster, Node
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, Sharding
from orchestrator.worker.local import run_local

NUM_STEPS = 3
RTOL = 1e-5
TOLERANCE = 0.10


def plan_at(level: str, microbatch_size: int = 1) -> Plan:
    return Plan.model_validate(
        {
            "global_batch_size": 8,
            "microbatch_size": microbatch_size,
            "replicas": [
                {
                    "batch_size": b,
                    "stages": [{"device_type": "A100-80", "layers": [0, 5], "sharding": level}],
                }
                for b in (4, 3, 1)
            ],
        }
    )


@pytest.mark.slow  # two 3-rank runs of 3 steps: ~60-90 s on a busy 2-core machine
def test_full_layer_by_layer_matches_single_process_and_holds_a_layer_at_a_time() -> None:
    full, optimizer = plan_at("full"), plan_at("optimizer")
    assert sharding.runs_layer_by_layer(full) and not sharding.runs_layer_by_layer(optimizer)
    run = run_local(engine_config(full, optimizer="adam"), range(NUM_STEPS))
    ref_params, ref_losses = reference_params(full, NUM_STEPS, "adam")
    errors = layer_relative_errors(run.layer_states, ref_params)
    assert max(errors.values()) <= RTOL, errors
    for step, ref_loss in enumerate(ref_losses):
        shares = [r[step].loss for r in run.results.values() if r[step].loss is not None]
        assert sum(shares) == pytest.approx(ref_loss, rel=1e-5)

    baseline = run_local(engine_config(optimizer, optimizer="adam"), range(2))
    model = ModelSpec(name="gpt", vocab_size=256, dtype="fp32", **TINY_GPT)
    training = TrainingSpec(global_batch_size=8, microbatch_sizes=[1])
    layers = range(full.num_layers)
    weights, grads, opt = sharding.layerwise_state_bytes(model, training, layers, Sharding.FULL, 3)
    whole = sum(model.layer_params(i) for i in layers) * 4  # fp32 weights (or gradients)
    largest = max(model.layer_params(i) for i in layers) * 4
    cluster = Cluster(nodes=(Node.from_device("a", DeviceCatalog.builtin()["A100-80"], 3),))
    tables = CostTables.for_cluster(model, training, cluster)
    full_est, optimizer_est = (estimate_with_tables(p, cluster, tables) for p in (full, optimizer))
    for rank in range(3):
        counted = run.results[rank][-1].memory
        before = baseline.results[rank][-1].memory
        assert counted is not None and before is not None
        # the optimizer level holds whole weights and whole gradients at the peak
        assert before.weights_bytes == whole and before.grads_bytes == whole, rank
        # layer by layer: one layer's weights, a third of the gradients plus one layer's
        assert counted.weights_bytes == largest, rank
        assert abs(counted.grads_bytes - (whole / 3 + largest)) <= 8, rank
        held, was = (
            counted.weights_bytes + counted.grads_bytes,
            before.weights_bytes + before.grads_bytes,
        )
        assert held < 0.5 * was, (rank, held, was)
        # the cost model charges what the runtime holds
        assert abs((weights + grads) / held - 1) <= TOLERANCE, (rank, weights + grads, held)
        assert abs(opt / counted.optimizer_bytes - 1) <= TOLERANCE, (rank, opt, counted)
        # and the estimate's saving over the optimizer level is the counted one
        saved = before.state_bytes - counted.state_bytes
        predicted = optimizer_est.devices[rank].memory_bytes - full_est.devices[rank].memory_bytes
        assert abs(predicted / saved - 1) <= TOLERANCE, (rank, predicted, saved)

"""Each rank's counted memory matches the cost model's per-rank terms (fp32, bf16 and recompute
plans).

The ranks run as gloo processes on the CPU (``run_local``); the cost model reads a profile the
profiler measured on the same model, as a planned run would.
"""

from __future__ import annotations

import pytest
from dist_cases import DATA, GPT_FACTORY, TINY_GPT, engine_config, make_plan

from orchestrator.costmodel import CostTables, estimate_with_tables
from orchestrator.costmodel.memory_terms import memory_terms
from orchestrator.spec.cluster import Cluster, Node
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.profiles import ProfileSet
from orchestrator.worker import topology
from orchestrator.worker.local import run_local
from orchestrator.worker.profiler import ProfileRequest, profile

TOLERANCE = 0.10


def _within(measured: float, predicted: float) -> bool:
    if measured == 0:
        return predicted == 0
    return abs(predicted / measured - 1) <= TOLERANCE


@pytest.mark.parametrize(
    ("precision", "recompute"), [("fp32", False), ("bf16", False), ("fp32", True), ("bf16", True)]
)
def test_counted_memory_per_rank_matches_the_cost_model(precision: str, recompute: bool) -> None:
    # A whole-model replica (1 microbatch in flight) and a two-stage pipeline (its first stage
    # holds 2 under 1F1B), two microbatches each; with recompute, on every stage.
    plan = make_plan(
        [(4, [((0, 5), "A100-80")]), (4, [((0, 2), "A100-80"), ((2, 5), "A100-80")])],
        microbatch_size=2,
    )
    if recompute:
        plan = plan.model_copy(
            update={
                "replicas": [
                    rep.model_copy(
                        update={
                            "stages": [s.model_copy(update={"recompute": True}) for s in rep.stages]
                        }
                    )
                    for rep in plan.replicas
                ]
            }
        )
    measured_profile = profile(
        ProfileRequest(GPT_FACTORY, dict(TINY_GPT), "A100-80", (2,), DATA, warmup=0, repeats=1)
    )
    model = ModelSpec(name=measured_profile.model, vocab_size=256, dtype="fp32", **TINY_GPT)
    training = TrainingSpec(
        global_batch_size=plan.global_batch_size,
        microbatch_sizes=[2],
        precision=None if precision == "fp32" else precision,
    )
    cluster = Cluster(nodes=(Node.from_device("a", DeviceCatalog.builtin()["A100-80"], 4),))
    tables = CostTables.for_cluster(model, training, cluster, ProfileSet([measured_profile]))
    predicted = {(t.replica, t.stage): t for t in memory_terms(plan, tables)}
    estimate = estimate_with_tables(plan, cluster, tables)

    run = run_local(engine_config(plan, precision=precision), range(2))

    for spec in topology.ranks_for_plan(plan):
        counted = run.results[spec.rank][-1].memory
        assert counted is not None
        want = predicted[(spec.replica, spec.stage)]
        where = f"rank {spec.rank} ({precision}{', recompute' if recompute else ''})"
        assert counted.microbatches_in_flight == want.microbatches_in_flight, where
        for name, got, pred in [
            ("weights", counted.weights_bytes, want.weights_bytes),
            ("grads", counted.grads_bytes, want.grads_bytes),
            ("optimizer", counted.optimizer_bytes, want.optimizer_bytes),
            ("activations", counted.activations_peak_bytes, want.activations_bytes),
            ("total", counted.total_bytes, want.counted_bytes),
        ]:
            assert _within(got, pred), f"{where} {name}: counted {got}, predicted {pred:.0f}"
        if precision == "bf16":
            assert _within(counted.cast_weight_bytes, want.cast_weight_bytes), where
        else:
            assert counted.cast_weight_bytes == 0 == want.cast_weight_bytes, where
        # The terms are the estimate's figure for the device, split.
        device = next(
            d for d in estimate.devices if (d.replica, d.stage) == (spec.replica, spec.stage)
        )
        assert device.memory_bytes == pytest.approx(want.total_bytes)
        assert (want.recompute_transient_bytes > 0) == recompute, where

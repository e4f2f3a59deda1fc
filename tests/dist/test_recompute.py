"""Activation recompute changes memory, not results: a plan recomputing its stages' blocks trains
to the same parameters as the same plan without (fp32, real gloo process groups)."""

from __future__ import annotations

import json

import pytest
from dist_cases import engine_config, make_plan, tensor_relative_errors

from orchestrator.spec.plan import Plan
from orchestrator.worker.local import run_local

NUM_STEPS = 2
EXACT = 1e-6  # per parameter tensor: max |theta - theta_plain| / max |theta_plain|

# Two replicas cut at different layers, 1F1B with 2 microbatches each; their gradients meet in
# the overlapped all-reduce, started from hooks during the (recomputing) backward.
PLAIN = make_plan(
    [
        (4, [((0, 3), "A100"), ((3, 5), "A100")]),
        (4, [((0, 2), "A100"), ((2, 5), "A100")]),
    ]
)


def _with_recompute(plan: Plan, stages: set[tuple[int, int]]) -> Plan:
    data = json.loads(plan.to_json())
    for r, replica in enumerate(data["replicas"]):
        for s, stage in enumerate(replica["stages"]):
            stage["recompute"] = (r, s) in stages
    return Plan.model_validate(data)


@pytest.mark.slow
def test_recompute_trains_to_the_parameters_of_no_recompute() -> None:
    recomputed = _with_recompute(PLAIN, {(0, 0), (0, 1), (1, 0)})
    plain = run_local(engine_config(PLAIN), range(NUM_STEPS))
    rec = run_local(engine_config(recomputed), range(NUM_STEPS))
    reference = {i: s["params"] for i, s in plain.layer_states.items()}
    errors = tensor_relative_errors(rec.layer_states, reference)
    assert max(errors.values()) <= EXACT, errors
    for rank, results in plain.results.items():
        for got, want in zip(rec.results[rank], results, strict=True):
            if want.loss is not None:
                assert got.loss == pytest.approx(want.loss, rel=1e-6, abs=0.0)

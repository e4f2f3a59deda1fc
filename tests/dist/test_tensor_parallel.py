"""Tensor-parallel stages (torch.distributed.tensor.parallel over gloo) reproduce single-process
fp32 training: parameters after N steps within 1e-5 relative per planner layer (Adam; see
test_exactness for why per layer), losses within 1e-5.
"""

from __future__ import annotations

from typing import Any

import pytest
from dist_cases import engine_config, layer_relative_errors, reference_params

from orchestrator.errors import SpecError
from orchestrator.spec.plan import Plan
from orchestrator.worker.engine import preflight
from orchestrator.worker.local import run_local

NUM_STEPS = 3
RTOL = 1e-5


def tp_plan(replicas: list[tuple[int, list[tuple[tuple[int, int], int]]]]) -> Plan:
    """``[(batch_size, [((start, end), tp), ...]), ...]`` -> Plan (microbatch 2)."""
    return Plan.model_validate(
        {
            "global_batch_size": sum(b for b, _ in replicas),
            "microbatch_size": 2,
            "replicas": [
                {
                    "batch_size": b,
                    "stages": [
                        {"layers": list(span), "device_type": "A100", "tp": tp}
                        for span, tp in stages
                    ],
                }
                for b, stages in replicas
            ],
        }
    )


CASES = {
    # the whole model on one tp-2 stage
    "tp2-whole": tp_plan([(4, [((0, 5), 2)])]),
    # a pipeline tp 1 -> tp 2 -> tp 1, and a tp-1 replica sharing every layer with it (the
    # gradient exchange lines up the tp-2 stage's slices with the other replica's whole tensors)
    "pipeline-tp1-tp2-tp1+replica": tp_plan(
        [(5, [((0, 1), 1), ((1, 4), 2), ((4, 5), 1)]), (3, [((0, 5), 1)])]
    ),
}


def _check(plan: Plan, run: Any) -> None:
    ref_params, ref_losses = reference_params(plan, NUM_STEPS, "adam")
    errors = layer_relative_errors(run.layer_states, ref_params)
    assert max(errors.values()) <= RTOL, errors
    for step, ref_loss in enumerate(ref_losses):
        shares = [r[step].loss for r in run.results.values() if r[step].loss is not None]
        assert len(shares) == len(plan.replicas)  # one report per replica, not per tp rank
        assert sum(shares) == pytest.approx(ref_loss, rel=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tensor_parallel_plan_matches_single_process(name: str) -> None:
    plan = CASES[name]
    run = run_local(engine_config(plan, optimizer="adam"), range(NUM_STEPS))
    _check(plan, run)


def test_replan_tp2_to_tp1_and_back_through_whole_states() -> None:
    """2 steps at tp 2, the merged whole state restored at tp 1 for step 2, then cut again for
    tp 2 for step 3: the same 4 steps as single-process training."""
    tp2 = tp_plan([(4, [((0, 5), 2)])])
    tp1 = tp_plan([(4, [((0, 2), 1), ((2, 5), 1)])])
    first = run_local(engine_config(tp2), range(0, 2))
    middle = run_local(engine_config(tp1), range(2, 3), initial_states=first.layer_states)
    last = run_local(engine_config(tp2), range(3, 4), initial_states=middle.layer_states)
    ref_params, _ = reference_params(tp2, 4, "adam")
    errors = layer_relative_errors(last.layer_states, ref_params)
    assert max(errors.values()) <= RTOL, errors


def test_tp_degree_that_does_not_divide_heads_is_refused() -> None:
    plan = tp_plan([(4, [((0, 5), 3)])])  # 4 heads
    with pytest.raises(SpecError, match="tp=3 does not divide num_heads"):
        preflight(engine_config(plan))

"""Sharded data parallel (optimizer state / gradients split across the holders of a layer)
reproduces single-process fp32 training: parameters after N steps within 1e-5 relative per
planner layer (Adam), losses within 1e-5; and the sharded holders' slices merge into the whole
per-layer state that restores into any plan.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from dist_cases import (
    DATA,
    GPT_FACTORY,
    TINY_GPT,
    engine_config,
    layer_relative_errors,
    reference_params,
)

from orchestrator.spec.plan import Plan
from orchestrator.worker.local import run_local
from orchestrator.worker.recipe import OptimizerRecipe
from orchestrator.worker.reference import ReferenceTrainer

NUM_STEPS = 3
RTOL = 1e-5


def plan_of(replicas: list[tuple[int, list[dict[str, Any]]]]) -> Plan:
    """``[(batch_size, [stage dict without device_type, ...]), ...]`` -> Plan (microbatch 2)."""
    return Plan.model_validate(
        {
            "global_batch_size": sum(b for b, _ in replicas),
            "microbatch_size": 2,
            "replicas": [
                {"batch_size": b, "stages": [{"device_type": "A100", **st} for st in stages]}
                for b, stages in replicas
            ],
        }
    )


def whole(sharding: str = "none", tp: int = 1) -> dict[str, Any]:
    return {"layers": [0, 5], "sharding": sharding, "tp": tp}


CASES = {
    # three holders, all sharding gradients and optimizer state, batch shares 4:3:1 (the slices
    # are equal: they are decoupled from the batch shares)
    "3-sharded-gradients-4:3:1": plan_of(
        [(4, [whole("gradients")]), (3, [whole("gradients")]), (1, [whole("gradients")])]
    ),
    # parameters sharded at rest too (ZeRO-3): gathered once a step, released after the backward
    "3-sharded-full-4:3:1": plan_of(
        [(4, [whole("full")]), (3, [whole("full")]), (1, [whole("full")])]
    ),
    # two fully sharded holders beside a pipelined unsharded replica: whole gradients are
    # all-reduced over every holder, the sharded ones keep their slices
    "2-full+pipeline-unsharded": plan_of(
        [(3, [whole("full")]), (2, [whole("full")]), (3, [{"layers": [0, 2]}, {"layers": [2, 5]}])]
    ),
    "3-sharded-optimizer-4:3:1": plan_of(
        [(4, [whole("optimizer")]), (3, [whole("optimizer")]), (1, [whole("optimizer")])]
    ),
    # a sharded group of two, a pipeline with a tp-2 stage, and an unsharded replica
    "sharded+tp-pipeline+unsharded": plan_of(
        [
            (3, [whole("gradients")]),
            (2, [whole("gradients")]),
            (2, [{"layers": [0, 2]}, {"layers": [2, 5], "tp": 2}]),
            (1, [whole()]),
        ]
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sharded_plan_matches_single_process(name: str) -> None:
    plan = CASES[name]
    run = run_local(engine_config(plan, optimizer="adam"), range(NUM_STEPS))
    ref_params, ref_losses = reference_params(plan, NUM_STEPS, "adam")
    errors = layer_relative_errors(run.layer_states, ref_params)
    assert max(errors.values()) <= RTOL, errors
    for step, ref_loss in enumerate(ref_losses):
        shares = [r[step].loss for r in run.results.values() if r[step].loss is not None]
        assert len(shares) == len(plan.replicas)
        assert sum(shares) == pytest.approx(ref_loss, rel=1e-5)
    # the merged optimizer state is whole: every parameter has Adam moments of its own shape
    for state in run.layer_states.values():
        moments = state["optimizer"]["state"]
        assert len(moments) == len(state["params"])
        # state indices follow the recipe's param groups: 2+-dimensional tensors first
        params = state["params"]
        order = [n for n in params if params[n].ndim >= 2] + [
            n for n in params if params[n].ndim < 2
        ]
        for j, name in enumerate(order):
            assert moments[j]["exp_avg"].shape == params[name].shape


@pytest.mark.slow  # two 3-rank runs: ~26 s on a busy 2-core machine
def test_fully_sharded_holders_keep_only_their_slice_between_steps() -> None:
    """After each step's update and until the next step's gather, a ``full`` holder keeps no
    whole parameter, only its third of the flat parameters; ``gradients`` holders keep theirs."""
    for name, released in (("3-sharded-full-4:3:1", True), ("3-sharded-gradients-4:3:1", False)):
        plan = CASES[name]
        run = run_local(engine_config(plan, optimizer="adam"), range(2))
        whole_bytes = sum(
            t.numel() * t.element_size()
            for state in run.layer_states.values()
            for t in state["params"].values()
        )
        for rank, results in run.results.items():
            for r in results:
                if released:
                    assert r.end_param_bytes == 0, (name, rank, r.step, r.end_param_bytes)
                else:
                    assert r.end_param_bytes == whole_bytes, (name, rank, r.step)
                # each holder's slice: a third of the flat parameters (within one element)
                assert abs(r.end_slice_bytes - whole_bytes / 3) <= 4, (name, rank, r.step)


@pytest.mark.parametrize("level", ["gradients", "full"])
def test_sharded_over_3_to_unsharded_tp2_and_back(level: str) -> None:
    """Steps 0-1 sharded over 3, step 2 on one unsharded tp-2 stage (whole states merged from
    the slices, cut again for tp), step 3 sharded over 3 again: single-process training."""
    sharded = CASES[f"3-sharded-{level}-4:3:1"]
    tp2 = plan_of([(8, [whole(tp=2)])])
    first = run_local(engine_config(sharded), range(0, 2))
    middle = run_local(engine_config(tp2), range(2, 3), initial_states=first.layer_states)
    last = run_local(engine_config(sharded), range(3, 4), initial_states=middle.layer_states)
    ref_params, _ = reference_params(sharded, 4, "adam")
    errors = layer_relative_errors(last.layer_states, ref_params)
    assert max(errors.values()) <= RTOL, errors


# AdamW with weight decay on matrices only, betas of its own, and a clip the gradients exceed.
RECIPE = OptimizerRecipe(
    name="adamw", learning_rate=1e-3, weight_decay=0.1, beta2=0.95, grad_clip_norm=0.05
)
RECIPE_CASES = {
    # the group's writer (lowest holder) shards: each holder's slice counts in the clip norm
    "3-full-4:3:1": CASES["3-sharded-full-4:3:1"],
    # the writer is an unsharded pipeline: it counts whole gradients, the sharded holders none
    "unsharded-pipeline+2-gradients": plan_of(
        [
            (3, [{"layers": [0, 2]}, {"layers": [2, 5]}]),
            (3, [whole("gradients")]),
            (2, [whole("gradients")]),
        ]
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECIPE_CASES))
def test_sharded_plan_with_weight_decay_and_clipping_matches_single_process(name: str) -> None:
    plan = RECIPE_CASES[name]
    run = run_local(engine_config(plan, recipe=RECIPE), range(NUM_STEPS))
    ref = ReferenceTrainer(GPT_FACTORY, dict(TINY_GPT), DATA, plan.global_batch_size, recipe=RECIPE)
    unclipped = ReferenceTrainer(
        GPT_FACTORY,
        dict(TINY_GPT),
        DATA,
        plan.global_batch_size,
        recipe=replace(RECIPE, grad_clip_norm=None),
    )
    for step in range(NUM_STEPS):
        ref.train_step(step)
        unclipped.train_step(step)
    errors = layer_relative_errors(run.layer_states, ref.layer_params())
    assert max(errors.values()) <= RTOL, errors
    # the clip was active: without it the parameters end elsewhere
    assert max(layer_relative_errors(run.layer_states, unclipped.layer_params()).values()) > 1e-4

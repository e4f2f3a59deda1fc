"""A model whose training state fits its devices only with parameters sharded layer by layer is
planned fully sharded over every device (``planner/sharded.py`` costed with the terms of
``worker/layerwise.py``, ``costmodel/sharding.py``).

The toy of ``test_sharded_pipelines``: a 4-block model of ~0.2 GiB blocks (fp32 Adam, 16 bytes a
parameter, ~0.78 GiB of state) on four 0.36 GiB devices, at most 2 pipeline stages. Half the
model unsharded does not fit a device, so no unsharded plan fits; a whole replica on each device
sharding ``full`` layer by layer holds its quarter of the state plus one block's whole weights
and gradients (~0.29 GiB) and fits.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.costmodel import CostTables, estimate_with_tables, sharding
from orchestrator.costmodel.presets import ORCHESTRATOR
from orchestrator.errors import InfeasibleError
from orchestrator.planner import make_plan
from orchestrator.planner.selection import SearchConfig
from orchestrator.spec import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, Sharding

from .toy import GiB, cluster, profiles

LAYERS = 6
MODEL = ModelSpec(
    name="toy",
    num_layers=4,
    hidden_size=1024,
    num_heads=16,
    sequence_length=4,
    vocab_size=1024,
    dtype="fp32",
)
TRAINING = TrainingSpec(
    global_batch_size=8,
    microbatch_sizes=[1],
    activation_recompute=False,
    max_tensor_parallel=1,
    max_pipeline_stages=2,
)


def test_a_model_that_fits_only_fully_sharded_is_planned_fully_sharded() -> None:
    c = cluster(("dev", 1, 4), memory_gib={"dev": 0.36}).resolve()
    p = profiles({"dev": 0.01}, LAYERS, update_s=0.0)
    with pytest.raises(InfeasibleError):
        make_plan(c, MODEL, TRAINING, p, SearchConfig(sharded=False))
    chosen = make_plan(c, MODEL, TRAINING, p)
    plan = chosen.plan
    assert len(plan.replicas) == 4
    assert all(len(r.stages) == 1 for r in plan.replicas)
    assert all(r.stages[0].sharding is Sharding.FULL for r in plan.replicas)
    assert sharding.runs_layer_by_layer(plan)
    assert chosen.estimate.fits
    # the same layout at ``gradients`` keeps whole weights and does not fit
    tables = CostTables.for_cluster(MODEL, TRAINING, c, p)
    at_gradients = _with_level(plan, Sharding.GRADIENTS)
    assert not estimate_with_tables(at_gradients, c, tables).fits
    # nor does ``full`` charged as the once-a-step path (whole weights and gradients at the peak)
    runtime = replace(ORCHESTRATOR, layerwise_sharded_replicas=False)
    once = CostTables.for_cluster(MODEL, TRAINING, c, p, runtime=runtime)
    assert not estimate_with_tables(plan, c, once).fits
    assert chosen.estimate.peak_memory_bytes < 0.36 * GiB


def _with_level(plan: Plan, level: Sharding) -> Plan:
    return plan.model_copy(
        update={
            "replicas": [
                r.model_copy(
                    update={"stages": [s.model_copy(update={"sharding": level}) for s in r.stages]}
                )
                for r in plan.replicas
            ]
        }
    )

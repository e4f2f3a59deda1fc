"""The cost model's per-rank memory, term by term, as a running rank counts it.

``estimate_plan`` gives each device one figure; this splits it into the terms that
``worker/memory_account.py`` measures on a rank (``spec/reports.py: MemoryUse``): weights,
gradients, optimizer state, autocast's 16-bit weight copies, activations of the microbatches in
flight, and the runtime's fixed footprint. For unsharded stages the terms add up to the estimate's
``memory_bytes``; sharded stages (whose state is split over their shard group) are not split here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.costmodel import memory
from orchestrator.costmodel.tables import CostTables
from orchestrator.spec.model import LayerKind
from orchestrator.spec.plan import Plan


@dataclass(frozen=True)
class MemoryTerms:
    """One stage's devices (each of its ``tp`` alike): predicted bytes per term."""

    replica: int
    stage: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    cast_weight_bytes: float
    activations_bytes: float  # all microbatches in flight at the stage's peak
    microbatches_in_flight: int
    framework_bytes: float
    # Activation recompute: one microbatch's full activations of the largest recomputed block,
    # live only while that block's forward is re-run in the backward. A rank's account counts what
    # the forward saves, so this term stands beside the counted ones (0 without recompute).
    recompute_transient_bytes: float = 0.0

    @property
    def counted_bytes(self) -> float:
        """What a rank's memory account counts: everything but the framework footprint."""
        return (
            self.weights_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.cast_weight_bytes
            + self.activations_bytes
        )

    @property
    def total_bytes(self) -> float:
        """The device's predicted peak: what is counted, the recompute transient and the
        framework footprint (the estimate's ``memory_bytes``)."""
        return self.counted_bytes + self.recompute_transient_bytes + self.framework_bytes


def memory_terms(plan: Plan, tables: CostTables, schedule: str = "1f1b") -> tuple[MemoryTerms, ...]:
    """Per (replica, stage) of ``plan``: the predicted memory terms of one of its devices."""
    model = tables.model
    out: list[MemoryTerms] = []
    for r, rep in enumerate(plan.replicas):
        num_micro = math.ceil(rep.batch_size / plan.microbatch_size)
        for s, stage in enumerate(rep.stages):
            start, end = stage.layers
            terms = tables.state_terms(stage.device_type)
            params = sum(model.layer_params(i) for i in range(start, end)) / stage.tp
            cast_params = (
                sum(
                    model.layer_params(i)
                    for i in range(start, end)
                    if model.layer_kind(i) is not LayerKind.EMBEDDING
                    # A recomputed block's copies live only in the recompute transient.
                    and not (stage.recompute and model.layer_kind(i) is LayerKind.BLOCK)
                )
                / stage.tp
            )
            table = tables.table(
                stage.device_type, plan.microbatch_size, stage.tp, recompute=stage.recompute
            )
            in_flight = memory.microbatches_in_flight(s, len(rep.stages), num_micro, schedule)
            out.append(
                MemoryTerms(
                    replica=r,
                    stage=s,
                    weights_bytes=params * terms.weights,
                    grads_bytes=params * terms.grads,
                    optimizer_bytes=params * terms.optimizer,
                    cast_weight_bytes=cast_params * terms.cast_weights,
                    activations_bytes=in_flight * table.activation_bytes(start, end),
                    microbatches_in_flight=in_flight,
                    framework_bytes=tables.framework_overhead_bytes(stage.device_type),
                    recompute_transient_bytes=table.transient_max_bytes(start, end),
                )
            )
    return tuple(out)

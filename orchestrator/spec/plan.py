"""The Plan: which devices run which layers, with which share of the batch.

A plan has one or more *replicas* (data-parallel copies of the model). Each replica is a pipeline
of *stages*; stage ``i`` runs planner layers ``[start, end)`` on ``tp`` devices of one type
(tensor parallel within one node). Replicas may use different device types and different stage
boundaries; their ``batch_size`` values add up to ``global_batch_size``. Written by
``orchestrator plan``, read by ``orchestrator estimate`` and ``orchestrator run``.

``sharding`` says how much of a stage's training state is split across the other stages that hold
the same layers (sharded data parallel, the ZeRO stages of Rajbhandari et al. 2020): ``none``
keeps it whole, ``optimizer`` shards the optimizer state (ZeRO-1), ``gradients`` also the
gradients (ZeRO-2), ``full`` also the parameters at rest (ZeRO-3). A layer's shard group is the set
of its holders whose stages shard it; they must agree on the level.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from orchestrator.errors import SpecError
from orchestrator.spec.devices import Dtype

PLAN_FORMAT = "orchestrator-plan/v1"


class Sharding(StrEnum):
    """How much training state a stage shards across the other holders of its layers."""

    NONE = "none"
    OPTIMIZER = "optimizer"  # ZeRO-1
    GRADIENTS = "gradients"  # ZeRO-2: optimizer state and gradients
    FULL = "full"  # ZeRO-3: optimizer state, gradients and parameters

    @property
    def shards_gradients(self) -> bool:
        return self in (Sharding.GRADIENTS, Sharding.FULL)

    @property
    def shards_parameters(self) -> bool:
        return self is Sharding.FULL


class StageSpec(BaseModel):
    """One pipeline stage: layers ``[start, end)`` on ``tp`` devices of ``device_type``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: tuple[int, int]
    device_type: str = Field(min_length=1)
    tp: PositiveInt = 1
    node: str | None = None
    sharding: Sharding = Sharding.NONE
    # Activation recompute: the stage keeps only each block's input per microbatch in flight and
    # recomputes the block's forward during its backward (``torch.utils.checkpoint``).
    recompute: bool = False

    @model_validator(mode="after")
    def _non_empty(self) -> StageSpec:
        start, end = self.layers
        if start < 0 or end <= start:
            raise ValueError(f"layers [{start}, {end}) is empty or negative; need 0 <= start < end")
        return self

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


class ReplicaSpec(BaseModel):
    """One data-parallel replica: a pipeline of stages and its share of the global batch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_size: PositiveInt
    stages: tuple[StageSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _contiguous(self) -> ReplicaSpec:
        if self.stages[0].layers[0] != 0:
            raise ValueError(
                f"the first stage must start at layer 0, not {self.stages[0].layers[0]}"
            )
        for i in range(1, len(self.stages)):
            prev_end, start = self.stages[i - 1].layers[1], self.stages[i].layers[0]
            if start != prev_end:
                raise ValueError(
                    f"stage {i} starts at layer {start} but stage {i - 1} ends at {prev_end}; "
                    "stages must cover the layers contiguously"
                )
        return self

    @property
    def num_layers(self) -> int:
        return self.stages[-1].layers[1]

    @property
    def num_devices(self) -> int:
        return sum(s.tp for s in self.stages)


class Plan(BaseModel):
    """A complete data x pipeline x tensor parallel plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = PLAN_FORMAT
    global_batch_size: PositiveInt
    microbatch_size: PositiveInt
    replicas: tuple[ReplicaSpec, ...] = Field(min_length=1)
    # The number format every rank computes in (fp32, or bf16/fp16 over fp32 master weights), as
    # the plan was costed; the runtime runs exactly it. None: the job's training.precision.
    precision: Dtype | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        total = sum(r.batch_size for r in self.replicas)
        if total != self.global_batch_size:
            shares = " + ".join(str(r.batch_size) for r in self.replicas)
            raise ValueError(
                f"replica batch sizes add up to {shares} = {total}, not global_batch_size "
                f"({self.global_batch_size}); make them add up"
            )
        layer_counts = {r.num_layers for r in self.replicas}
        if len(layer_counts) > 1:
            raise ValueError(
                f"replicas cover different layer counts {sorted(layer_counts)}; every replica "
                "must run the whole model"
            )
        return self

    @property
    def num_layers(self) -> int:
        return self.replicas[0].num_layers

    @property
    def num_devices(self) -> int:
        return sum(r.num_devices for r in self.replicas)

    def device_counts(self) -> dict[str, int]:
        """Devices of each type the plan uses."""
        counts: dict[str, int] = {}
        for r in self.replicas:
            for s in r.stages:
                counts[s.device_type] = counts.get(s.device_type, 0) + s.tp
        return counts

    def ranked_stages(self) -> tuple[tuple[int, int, StageSpec], ...]:
        """``(replica, stage, spec)`` in rank order: replica-major, stage-minor, one entry per
        stage (a stage at tp ``n`` has ``n`` ranks: :meth:`first_ranks`)."""
        return tuple(
            (r, i, stage)
            for r, rep in enumerate(self.replicas)
            for i, stage in enumerate(rep.stages)
        )

    def first_ranks(self) -> dict[tuple[int, int], int]:
        """``(replica, stage) -> `` the rank of the stage's first tensor-parallel position (the
        workers' numbering: replica-major, stage-minor, a stage's ``tp`` ranks consecutive)."""
        out: dict[tuple[int, int], int] = {}
        rank = 0
        for r, i, stage in self.ranked_stages():
            out[(r, i)] = rank
            rank += stage.tp
        return out

    def with_stages(self, change: Callable[[StageSpec], StageSpec]) -> Plan:
        """This plan with ``change`` applied to every stage (e.g. every stage unsharded)."""
        return self.model_copy(
            update={
                "replicas": tuple(
                    r.model_copy(update={"stages": tuple(change(s) for s in r.stages)})
                    for r in self.replicas
                )
            }
        )

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, fixed separators, so equal plans are equal bytes.

        ``sharding: none``, ``recompute: false`` and ``precision: null`` (the defaults) are left
        out, so plans without them keep their bytes.
        """
        data = self.model_dump(mode="json")
        if data.get("precision") is None:
            del data["precision"]
        for replica in data["replicas"]:
            for stage in replica["stages"]:
                if stage.get("sharding") == Sharding.NONE.value:
                    del stage["sharding"]
                if stage.get("recompute") is False:
                    del stage["recompute"]
        return json.dumps(data, sort_keys=True, indent=2) + "\n"

    def check_layouts(
        self, num_heads: int, ffn_size: int, max_devices_per_node: dict[str, int]
    ) -> None:
        """Raise :class:`SpecError` for a tp degree the model or a node cannot take, or a layer
        whose shard group disagrees on the sharding level.

        ``max_devices_per_node``: device type -> most devices of that type on one node (a
        tensor-parallel stage runs within one node).
        """
        for r, replica in enumerate(self.replicas):
            for s, stage in enumerate(replica.stages):
                where = f"plan.replicas[{r}].stages[{s}].tp"
                if num_heads % stage.tp or ffn_size % stage.tp:
                    raise SpecError(
                        f"tp={stage.tp} does not divide num_heads ({num_heads}) and the MLP "
                        f"width ({ffn_size})",
                        field=where,
                        fix="use a tp degree that divides both",
                    )
                per_node = max_devices_per_node.get(stage.device_type, 0)
                if stage.tp > per_node:
                    raise SpecError(
                        f"tp={stage.tp} needs {stage.tp} {stage.device_type} devices on one node; "
                        f"the largest such node has {per_node}",
                        field=where,
                        fix=f"use tp <= {per_node} or add bigger {stage.device_type} nodes",
                    )
        for layer in range(self.num_layers):
            levels = {
                st.sharding
                for rep in self.replicas
                for st in rep.stages
                if st.layers[0] <= layer < st.layers[1] and st.sharding is not Sharding.NONE
            }
            if len(levels) > 1:
                raise SpecError(
                    f"planner layer {layer} is sharded at different levels "
                    f"{sorted(v.value for v in levels)} by the stages that hold it",
                    field="plan.replicas[].stages[].sharding",
                    fix="give every sharded stage holding a layer the same sharding level",
                )

    def check_precision(self, named: Dtype | None, field: str = "plan.precision") -> None:
        """Raise :class:`SpecError` when the plan records a precision other than ``named`` (the
        format a job's ``training.precision`` names; None: unset or ``auto``, the plan's runs)."""
        if self.precision is not None and named is not None and self.precision is not named:
            raise SpecError(
                f"the plan's precision ({self.precision}) contradicts training.precision ({named})",
                field=field,
                fix=f"set training.precision to {self.precision} or auto, or re-plan with "
                "`orchestrator plan`",
            )

    def check_against(self, num_planner_layers: int, device_counts: dict[str, int]) -> None:
        """Raise :class:`SpecError` if the plan does not fit the model or the cluster."""
        if self.num_layers != num_planner_layers:
            raise SpecError(
                f"plan covers {self.num_layers} planner layers but the model has "
                f"{num_planner_layers} (num_layers + 2: embedding, blocks, head)",
                field="plan.replicas[].stages[].layers",
                fix="re-plan for this model with `orchestrator plan`",
            )
        for name, needed in sorted(self.device_counts().items()):
            have = device_counts.get(name, 0)
            if needed > have:
                raise SpecError(
                    f"plan needs {needed} {name} devices, the cluster has {have}",
                    field="plan.replicas[].stages[].device_type",
                    fix="re-plan for this cluster with `orchestrator plan`",
                )

"""The Plan: which devices run which layers, with which share of the batch.

A plan has one or more *replicas* (data-parallel copies of the model). Each replica is a pipeline
of *stages*; stage ``i`` runs planner layers ``[start, end)`` on ``tp`` devices of one type
(tensor parallel within one node). Replicas may use different device types and different stage
boundaries; their ``batch_size`` values add up to ``global_batch_size``. Written by
``orchestrator plan``, read by ``orchestrator estimate`` and ``orchestrator run``.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from orchestrator.errors import SpecError

PLAN_FORMAT = "orchestrator-plan/v1"


class StageSpec(BaseModel):
    """One pipeline stage: layers ``[start, end)`` on ``tp`` devices of ``device_type``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: tuple[int, int]
    device_type: str = Field(min_length=1)
    tp: PositiveInt = 1
    node: str | None = None

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
        """``(replica, stage, spec)`` in rank order: replica-major, stage-minor, one rank per
        stage (the workers run tensor-parallel degree 1)."""
        return tuple(
            (r, i, stage)
            for r, rep in enumerate(self.replicas)
            for i, stage in enumerate(rep.stages)
        )

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, fixed separators, so equal plans are equal bytes."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2) + "\n"

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

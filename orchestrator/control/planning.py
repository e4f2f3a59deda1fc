"""The controller's :class:`~orchestrator.control.ports.Planner` implementations.

:class:`MakePlanPlanner` turns a cluster snapshot into the planner's
:class:`~orchestrator.spec.cluster.Cluster` and calls :func:`orchestrator.planner.make_plan`.
:class:`FixedPlanner` is the planner of a run whose plan is given: it returns that plan whenever it
fits the usable nodes (so the controller never finds a better one to switch to, and after a
failure resumes on the same plan once it fits again), and raises
:class:`~orchestrator.errors.InfeasibleError` while it does not.

Measured slowness (a straggler) reaches the planner as a *derated device type*: a node found
``f`` times slower is planned as a copy of its type named ``"<type>~slow<f>"`` whose peak FLOP/s
and memory bandwidth are divided by ``f`` and whose profiles (if any) take ``f`` times longer.
The chosen plan is then written back with the real type name, so worker placement by device type
is unchanged. Memory is not derated: a throttled GPU holds as much as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from orchestrator.control.ports import PlanProposal
from orchestrator.errors import InfeasibleError
from orchestrator.policies.oom import MemoryCaps
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.devices import DeviceCatalog, DeviceType
from orchestrator.spec.model import AUTO_PRECISION, ModelSpec, Schedule, TrainingSpec
from orchestrator.spec.plan import Plan
from orchestrator.spec.profiles import LayerTiming, ProfileEntry, ProfileFile, ProfileSet
from orchestrator.spec.snapshot import ClusterSnapshot

if TYPE_CHECKING:  # the cost model loads on first use, with the search
    from orchestrator.costmodel.result import Estimate

SLOW_MARK = "~slow"


def stage_busy_s(estimate: Estimate) -> dict[tuple[int, int], float]:
    """(replica, stage) -> predicted forward, backward and update seconds per step: what a
    stage's ``StageTiming.compute_s`` measures (``PlanProposal.predicted_stage_s``)."""
    return {(d.replica, d.stage): d.compute_s + d.update_s for d in estimate.devices}


class MakePlanPlanner:
    """Plans with :func:`orchestrator.planner.make_plan` for one model and training setup."""

    def __init__(
        self,
        model: ModelSpec,
        training: TrainingSpec,
        profiles: ProfileSet | None = None,
        catalog: DeviceCatalog | None = None,
    ) -> None:
        self.model = model
        self.training = training
        self.profiles = profiles
        self.catalog = catalog or DeviceCatalog.builtin()
        self.memory = MemoryCaps()  # usable memory lowered after out-of-memory errors

    def lower_usable_memory(
        self, device_type: str, measured_usable_bytes: float | None
    ) -> tuple[float, float]:
        """Plan ``device_type`` with less memory from now on; (usable before, usable now)."""
        return self.memory.lower(self.catalog[device_type], measured_usable_bytes)

    def __call__(
        self, snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]
    ) -> PlanProposal:
        # The search is heavy; load it on first use.
        from orchestrator.planner import make_plan
        from orchestrator.planner.selection import SearchConfig

        cluster = cap_memory(snapshot.to_cluster(self.catalog), self.memory)
        cluster, profiles = derate(cluster, self.profiles, slowdown_by_node)
        # A run that recovers from survivors shards only where memory forces it (SearchConfig).
        search = SearchConfig(sharded_only_if_needed=True)
        result = make_plan(cluster, self.model, self.training, profiles, search)
        plan = restore_type_names(result.plan)
        self._pin_precision(plan)
        note = ""
        if any(SLOW_MARK in d for d in result.plan.device_counts()):
            note = f"planned with measured slowdowns {dict(sorted(slowdown_by_node.items()))}"
        return PlanProposal(
            plan=plan,
            predicted_step_s=result.estimate.step_time_s,
            bound_step_s=result.bound_step_time_s,
            predicted_stage_s=stage_busy_s(result.estimate),
            notes=note,
        )

    def _pin_precision(self, plan: Plan) -> None:
        # Under precision: auto the first plan's format is kept for the whole run: re-plans
        # compare step times in one format, and the loss curve keeps one numerics.
        if self.training.precision == AUTO_PRECISION and plan.precision is not None:
            self.training = self.training.model_copy(update={"precision": plan.precision})

    def estimate(
        self, plan: Plan, snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]
    ) -> float:
        """Predicted step time of ``plan`` (stages pinned to nodes) on ``snapshot``, with the
        measured slowdowns applied as :meth:`__call__` applies them to a search."""
        from orchestrator.costmodel import estimate_plan

        cluster = cap_memory(snapshot.to_cluster(self.catalog), self.memory)
        cluster, profiles = derate(cluster, self.profiles, slowdown_by_node)
        estimate = estimate_plan(
            derate_plan(plan, cluster), cluster, self.model, self.training, profiles
        )
        return estimate.step_time_s


class FixedPlanner:
    """Always ``plan``, estimated by the cost model on the usable nodes (see the module
    docstring). Measured slowdowns are ignored: the plan cannot change, and the switch rule is
    never consulted for a candidate equal to the running plan."""

    def __init__(
        self,
        plan: Plan,
        model: ModelSpec,
        training: TrainingSpec,
        profiles: ProfileSet | None = None,
        *,
        schedule: Schedule = Schedule.ONE_F_ONE_B,
        catalog: DeviceCatalog | None = None,
    ) -> None:
        self.plan = plan
        self.model = model
        self.training = training
        self.profiles = profiles
        self.schedule = schedule
        self.catalog = catalog or DeviceCatalog.builtin()

    def __call__(
        self, snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]
    ) -> PlanProposal:
        from orchestrator.costmodel import estimate_plan

        check_fits(self.plan, snapshot)
        cluster = snapshot.to_cluster(self.catalog)
        estimate = estimate_plan(
            self.plan, cluster, self.model, self.training, self.profiles, schedule=self.schedule
        )
        # No bound: the fluid bound belongs to a search over plans, and this plan was not searched.
        return PlanProposal(
            self.plan,
            estimate.step_time_s,
            float("nan"),
            predicted_stage_s=stage_busy_s(estimate),
            notes="fixed plan",
        )


def check_fits(plan: Plan, snapshot: ClusterSnapshot) -> None:
    """Raise :class:`InfeasibleError` unless the usable nodes of ``snapshot`` can host ``plan``:
    enough devices of every type, and every pinned node present with its type."""
    have = snapshot.devices_by_type()
    for name, needed in sorted(plan.device_counts().items()):
        if needed > have.get(name, 0):
            raise InfeasibleError(
                f"the fixed plan needs {needed} {name} devices, {have.get(name, 0)} are usable",
                field="plan",
                fix="bring the nodes back, or run without a fixed plan to re-plan",
            )
    for _, _, stage in plan.ranked_stages():
        node = snapshot.node(stage.node) if stage.node is not None else None
        if stage.node is not None and (node is None or node.device_type != stage.device_type):
            raise InfeasibleError(
                f"the fixed plan pins a {stage.device_type} stage to node {stage.node}, "
                "which is not a usable node of that type",
                field="plan.replicas[].stages[].node",
                fix="bring the node back, or drop the pin from the plan",
            )


def cap_memory(cluster: Cluster, caps: MemoryCaps) -> Cluster:
    """``cluster`` with each capped device type's usable memory lowered to its cap."""
    if not caps.usable_bytes:
        return cluster
    return Cluster(
        nodes=tuple(replace(n, device_type=caps.apply(n.device_type)) for n in cluster.nodes)
    )


def slow_name(device_type: str, factor: float) -> str:
    return f"{device_type}{SLOW_MARK}{factor:.2f}"


def derate(
    cluster: Cluster, profiles: ProfileSet | None, slowdown_by_node: Mapping[str, float]
) -> tuple[Cluster, ProfileSet | None]:
    """``cluster`` with each slowed node's device type replaced by a derated copy, and
    ``profiles`` extended with correspondingly slower copies."""
    slow = {n: f for n, f in slowdown_by_node.items() if f > 1.0 and n in cluster.node_by_name}
    if not slow:
        return cluster, profiles
    nodes = []
    derated: dict[str, tuple[str, float]] = {}  # derated name -> (real name, factor)
    for node in cluster.nodes:
        factor = slow.get(node.name)
        if factor is None:
            nodes.append(node)
            continue
        name = slow_name(node.device_type.name, factor)
        derated[name] = (node.device_type.name, factor)
        nodes.append(replace(node, device_type=_derated_type(node.device_type, name, factor)))
    return Cluster(nodes=tuple(nodes)), _derated_profiles(profiles, derated)


def derate_plan(plan: Plan, cluster: Cluster) -> Plan:
    """``plan`` with each pinned stage's device type named as its node's type in ``cluster``
    (a derated copy on a slowed node), the inverse of :func:`restore_type_names`."""
    return plan.with_stages(
        lambda s: (
            s.model_copy(update={"device_type": cluster.node_by_name[s.node].device_type.name})
            if s.node is not None and s.node in cluster.node_by_name
            else s
        )
    )


def restore_type_names(plan: Plan) -> Plan:
    """The plan with derated type names mapped back to the real ones."""
    return plan.with_stages(
        lambda s: s.model_copy(update={"device_type": s.device_type.split(SLOW_MARK)[0]})
    )


def _derated_type(device: DeviceType, name: str, factor: float) -> DeviceType:
    return device.model_copy(
        update={
            "name": name,
            "peak_flops_per_s": {d: v / factor for d, v in device.peak_flops_per_s.items()},
            "memory_bandwidth_bytes_per_s": device.memory_bandwidth_bytes_per_s / factor,
            "description": f"{device.description} (measured {factor:.2f}x slower)",
        }
    )


def _derated_profiles(
    profiles: ProfileSet | None, derated: dict[str, tuple[str, float]]
) -> ProfileSet | None:
    if profiles is None:
        return None
    files = list(profiles.files)
    for name, (real, factor) in sorted(derated.items()):
        for f in profiles.files:
            if f.device_type == real:
                files.append(_slower_profile(f, name, factor))
    return ProfileSet(files)


def _slower_profile(profile: ProfileFile, name: str, factor: float) -> ProfileFile:
    def slower(t: LayerTiming) -> LayerTiming:
        return t.model_copy(
            update={
                "forward_s": t.forward_s * factor,
                "backward_s": t.backward_s * factor,
                "update_s": None if t.update_s is None else t.update_s * factor,
            }
        )

    entries = [
        ProfileEntry(
            microbatch_size=e.microbatch_size,
            tp=e.tp,
            layers={i: slower(t) for i, t in e.layers.items()},
        )
        for e in profile.entries
    ]
    return profile.model_copy(update={"device_type": name, "entries": entries})

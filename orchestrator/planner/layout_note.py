"""Why the plan shards (or not) and which tensor-parallel degrees it uses: lines for the plan
output, from the candidates the search costed. Pure.
"""

from __future__ import annotations

from orchestrator.costmodel import Estimate
from orchestrator.spec.plan import Plan, Sharding


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.3f} s"


def sharding_line(
    chosen: Plan,
    unsharded: tuple[Plan, Estimate] | None,
    sharded: tuple[Plan, Estimate] | None,
    not_tried: str = "",
    piped: tuple[Plan, Estimate] | None = None,
    fits_unsharded: bool | None = None,
    cluster_devices: int | None = None,
) -> str:
    """One line: the sharding chosen (whole replicas sharded over every device or over some
    types' devices, or pipeline stages sharded across their replicas) and the costed
    alternative it beat; ``fits_unsharded``: whether the chosen shape would fit with nothing
    sharded (None: not known), said where it would not; ``cluster_devices``: the cluster's
    device count (None: the sharded data-parallel candidate spans every device)."""
    levels = sorted({s.sharding.value for r in chosen.replicas for s in r.stages} - {"none"})
    against = (
        f"{_s(unsharded[1].step_time_s)} for the best unsharded plan"
        if unsharded is not None
        else "no unsharded plan fits"
    )
    subset = sharded is not None and _types_only(sharded[0], cluster_devices)
    if levels and sharded is not None and chosen == sharded[0]:
        n = chosen.num_devices
        return (
            f"sharding: {', '.join(levels)} over {n} devices{f' ({subset} only)' if subset else ''}"
            f", {_s(sharded[1].step_time_s)} a step against {against}"
        )
    if levels and piped is not None:
        stages = [s for r in chosen.replicas for s in r.stages]
        on = [s for s in stages if s.sharding is not Sharding.NONE]
        only = "; this shape fits only sharded" if fits_unsharded is False else ""
        return (
            f"sharding: {', '.join(levels)} on {len(on)} of {len(stages)} pipeline stages "
            f"(each across its pipeline's replicas{only}), {_s(piped[1].step_time_s)} a step "
            f"against {against}"
        )
    if not_tried:
        return f"sharding: none (sharded data parallel not tried: {not_tried})"
    if sharded is None and piped is None:
        return "sharding: none (no sharded data-parallel plan fits)"
    parts = []
    if sharded is not None:
        level = sharded[0].replicas[0].stages[0].sharding
        over = f"the {sharded[0].num_devices} {subset} devices" if subset else "every device"
        parts.append(
            f"sharded data parallel at {level.value} over {over} would take "
            f"{_s(sharded[1].step_time_s)} a step"
        )
    if piped is not None:
        parts.append(f"sharded pipeline stages would take {_s(piped[1].step_time_s)} a step")
    # A sharded pipeline a hair faster is not taken (planner/sharded_pipelines.MIN_GAIN).
    slightly = (
        piped is not None
        and unsharded is not None
        and piped[1].step_time_s < unsharded[1].step_time_s
    )
    return f"sharding: none ({'; '.join(parts)}, not faster{' by 0.5%' if slightly else ''})"


def _types_only(plan: Plan, cluster_devices: int | None) -> str:
    """The device types a plan runs on, joined ("A100-40", "A100-40 and A6000"), where it
    leaves some of the cluster's ``cluster_devices`` idle; "" where it uses every device."""
    if cluster_devices is None or plan.num_devices >= cluster_devices:
        return ""
    types = sorted({s.device_type for r in plan.replicas for s in r.stages})
    return " and ".join(types)


def tp_line(chosen: Plan) -> str:
    """One line: the tensor-parallel degrees of the plan's stages, by device type."""
    degrees: dict[str, set[int]] = {}
    for replica in chosen.replicas:
        for stage in replica.stages:
            degrees.setdefault(stage.device_type, set()).add(stage.tp)
    split = {t: sorted(d) for t, d in sorted(degrees.items()) if max(d) > 1}
    if not split:
        return "tp: 1 on every stage (no tensor-parallel stage was faster within a node)"
    parts = [f"{t} tp {'/'.join(str(x) for x in d)}" for t, d in split.items()]
    return f"tp: {', '.join(parts)} (within a node; the cost model found it faster)"


def is_sharded(plan: Plan) -> bool:
    return any(s.sharding is not Sharding.NONE for r in plan.replicas for s in r.stages)

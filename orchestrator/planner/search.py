"""``make_plan``: the fastest plan that fits, with the fluid bound and two baselines beside it.

For each candidate microbatch size, :class:`~orchestrator.planner.selection.SelectionSearch`
chooses templates and replica counts; the best selection is placed on nodes and costed by the
full cost model. The two baselines (uniform data parallel, the way Ray Train and torchrun run,
and the best plan on the fastest device type alone) are costed by the same model, and the chosen
plan is never worse than either. Deterministic: inputs are sorted, ties broken on explicit keys,
no hashing of strings decides anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from orchestrator.costmodel import (
    CostTables,
    Estimate,
    FluidBound,
    estimate_with_tables,
    fluid_bound,
)
from orchestrator.costmodel.precision import costed_inputs
from orchestrator.costmodel.presets import ORCHESTRATOR, RuntimePreset
from orchestrator.errors import InfeasibleError
from orchestrator.planner.auto_precision import PrecisionDecision, plan_auto
from orchestrator.planner.layout_note import is_sharded, sharding_line, tp_line
from orchestrator.planner.placement import place
from orchestrator.planner.selection import SearchConfig, Selection, SelectionSearch
from orchestrator.planner.sharded import best_sharded_data_parallel
from orchestrator.planner.sharded_pipelines import MIN_GAIN, sharded_pipelines
from orchestrator.planner.templates import Template, TypeInfo, type_infos
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.devices import Dtype
from orchestrator.spec.model import AUTO_PRECISION, ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, ReplicaSpec, Sharding, StageSpec
from orchestrator.spec.profiles import ProfileSet

GiB = 1024**3


@dataclass(frozen=True)
class Baseline:
    name: str
    plan: Plan | None
    estimate: Estimate | None
    reason: str = ""


@dataclass(frozen=True)
class PlanResult:
    """The chosen plan with its estimate, the bound and the baselines."""

    plan: Plan
    estimate: Estimate
    bound: FluidBound
    baselines: dict[str, Baseline]
    search_time_s: float
    estimated_device_types: tuple[str, ...] = field(default=())
    # Under training.precision: auto, the format chosen and why (planner/auto_precision.py).
    precision_choice: PrecisionDecision | None = None
    # Why the plan shards or not, and its tp degrees (planner/layout_note.py).
    choices: tuple[str, ...] = field(default=())

    @property
    def bound_step_time_s(self) -> float:
        return self.bound.step_time_s

    @property
    def bound_ratio(self) -> float:
        """Predicted step time over the fluid bound (>= 1)."""
        return self.estimate.step_time_s / self.bound.step_time_s


def _microbatch_sizes(training: TrainingSpec) -> list[int]:
    return sorted({m for m in training.microbatch_sizes if m <= training.global_batch_size})


def _best_selection(
    tables: CostTables,
    infos: dict[str, TypeInfo],
    training: TrainingSpec,
    config: SearchConfig,
    device_types: list[str] | None = None,
    sharded: Sharding | None = None,
    stranded: set[str] | None = None,
    built: dict[int, dict[str, list[Template]]] | None = None,
    sizes: list[int] | None = None,
    ranked_sizes: list[int] | None = None,
    variants: bool = False,
) -> Selection | None:
    """Single-type templates at every microbatch size (or at ``sizes``); mixed-type replicas
    on top of the few microbatch sizes that did best (or of all, when single-type replicas
    found nothing).

    ``sharded``: also offer pipelines that fit only sharded at that level, on the ``stranded``
    types when some are given (else every type), reusing the other types' templates from
    ``built``, and with ``variants`` the sharded variants of the tp-1 pipelines that fit
    unsharded as well. Without ``sharded``, ``stranded`` receives the device types on which no
    single-type pipeline fits at any size, and ``built`` the templates built.
    ``ranked_sizes`` receives the microbatch sizes, those whose single-type selection did best
    first."""
    offer = frozenset(stranded) if sharded is not None and stranded else None
    searches = {
        mbs: SelectionSearch(
            tables,
            infos,
            training.global_batch_size,
            mbs,
            config,
            sharded,
            None if sharded is None or built is None else built.get(mbs),
            offer,
            variants,
        )
        for mbs in (_microbatch_sizes(training) if sizes is None else sizes)
    }
    if sharded is None and stranded is not None:
        stranded.update(
            d for d in infos if not any(search.homogeneous[d] for search in searches.values())
        )
    if sharded is None and built is not None:
        built.update({mbs: search.homogeneous for mbs, search in searches.items()})
    found = {mbs: search.run(device_types, mixed=False) for mbs, search in searches.items()}

    def rank(mbs: int) -> tuple[object, ...]:
        sel = found[mbs]
        return (0, sel.key, mbs) if sel is not None else (1, (), mbs)

    ranked = sorted(searches, key=rank)
    if ranked_sizes is not None:
        ranked_sizes.extend(ranked)
    if device_types is None:
        feasible = [m for m in ranked if found[m] is not None]
        for mbs in ranked if not feasible else feasible[: config.mixed_microbatch_sizes]:
            found[mbs] = searches[mbs].add_mixed(found[mbs])
    best: Selection | None = None
    for mbs in sorted(found):
        sel = found[mbs]
        if sel is not None and (best is None or sel.key < best.key):
            best = sel
    return best


def _may_shard(training: TrainingSpec, config: SearchConfig) -> bool:
    """Whether the search tries sharded candidates at all (never under fp16: the engine does
    not run loss scaling on sharded stages)."""
    return config.sharded and training.runtime_precision is not Dtype.FP16


def _costed(plan: Plan, cluster: Cluster, tables: CostTables) -> tuple[Plan, Estimate]:
    return plan, estimate_with_tables(plan, cluster, tables)


def uniform_data_parallel(
    cluster: Cluster, tables: CostTables, global_batch_size: int, microbatch_size: int
) -> Baseline:
    """Every device a whole replica with the same batch (remainder one sample each to the first)."""
    name = "uniform_data_parallel"
    devices = [(n.name, n.device_type.name) for n in cluster.nodes for _ in range(n.num_devices)]
    if global_batch_size < len(devices):
        return Baseline(
            name, None, None, f"global batch {global_batch_size} < {len(devices)} devices"
        )
    share, extra = divmod(global_batch_size, len(devices))
    layers = tables.model.num_planner_layers
    replicas = tuple(
        ReplicaSpec(
            batch_size=share + (1 if i < extra else 0),
            stages=(StageSpec(layers=(0, layers), device_type=t, tp=1, node=node),),
        )
        for i, (node, t) in enumerate(devices)
    )
    plan = Plan(
        global_batch_size=global_batch_size,
        microbatch_size=min(microbatch_size, share),
        replicas=replicas,
    )
    estimate = estimate_with_tables(plan, cluster, tables)
    if not estimate.fits:
        short = estimate.memory_shortfall_by_type()
        worst = max(sorted(short), key=lambda t: short[t])
        return Baseline(
            name, plan, None, f"does not fit: {worst} short by {short[worst] / GiB:.1f} GiB"
        )
    return Baseline(name, plan, estimate)


def _shortfall_message(tables: CostTables, infos: dict[str, TypeInfo]) -> str:
    """Why nothing fits (planner/infeasible.py): a proven shortfall, or the real cause."""
    from orchestrator.planner.infeasible import explain

    return explain(tables, infos)


def _nothing_fits(
    model: ModelSpec, tables: CostTables, infos: dict[str, TypeInfo]
) -> InfeasibleError:
    """The search's one-line refusal: how much memory is missing on which device type."""
    return InfeasibleError(
        f"no plan for {model.name} fits this cluster: {_shortfall_message(tables, infos)}",
        fix="add devices with more memory, shorten sequence_length, or lower microbatch_sizes",
    )


def _why_not_sharded(training: TrainingSpec, config: SearchConfig, *, unsharded_fits: bool) -> str:
    """Why the sharded candidates are not tried ("": they are)."""
    # The engine does not run fp16 loss scaling on sharded stages (worker/sharding.py).
    if training.runtime_precision is Dtype.FP16:
        return "fp16 loss scaling does not run sharded"
    if not config.sharded:
        return "turned off in the search"
    if config.sharded_only_if_needed and unsharded_fits:
        return "an unsharded plan fits, and it keeps every layer whole on a survivor"
    return ""


def _has_three_types(sel: Selection) -> bool:
    return any(len({name for name, _ in g.template.stage_types}) >= 3 for g in sel.groups)


def _fits_unsharded(plan: Plan, cluster: Cluster, tables: CostTables) -> bool | None:
    """Whether a plan with sharded stages would fit with none sharded (None: it shards none)."""
    if not is_sharded(plan):
        return None
    whole = plan.with_stages(lambda s: s.model_copy(update={"sharding": Sharding.NONE}))
    return estimate_with_tables(whole, cluster, tables).fits


def _placed(sel: Selection | None, cluster: Cluster, training: TrainingSpec) -> Plan | None:
    """The selection's replicas placed on nodes (None: no selection)."""
    return None if sel is None else place(list(sel.groups), cluster, training.global_batch_size)


def _plan_auto(
    cluster: Cluster,
    model: ModelSpec,
    training: TrainingSpec,
    profiles: ProfileSet | None,
    config: SearchConfig | None,
    runtime: RuntimePreset,
) -> PlanResult:
    """``training.precision: auto``: the search once per format, the fastest kept with the
    decision recorded (planner/auto_precision.py)."""
    decision, results = plan_auto(
        cluster,
        training,
        lambda c, t: make_plan(c, model, t, profiles, config, runtime=runtime),
        lambda r: r.estimate.step_time_s,
    )
    searched_s = sum(r.search_time_s for r in results.values())
    best = results[decision.precision]
    return replace(best, precision_choice=decision, search_time_s=searched_s)


def _fastest_type_only(
    cluster: Cluster,
    tables: CostTables,
    infos: dict[str, TypeInfo],
    training: TrainingSpec,
    config: SearchConfig,
    bound: FluidBound,
) -> Baseline:
    """The best plan on the fastest device type alone (by the fluid bound's rates)."""
    rates = bound.samples_per_s_by_type
    fastest = max(sorted(rates), key=lambda d: rates[d])
    only = _placed(_best_selection(tables, infos, training, config, [fastest]), cluster, training)
    if only is None:
        return Baseline(
            "fastest_type_only", None, None, f"the model does not fit on {fastest} alone"
        )
    plan, est = _costed(only, cluster, tables)
    return Baseline("fastest_type_only", plan, est, f"{fastest} only")


def _sharded_candidates(
    cluster: Cluster,
    tables: CostTables,
    infos: dict[str, TypeInfo],
    training: TrainingSpec,
    config: SearchConfig,
    unsharded: tuple[Plan, Estimate] | None,
    stranded: set[str],
    built: dict[int, dict[str, list[Template]]],
    ranked: list[int],
    bound: FluidBound,
) -> tuple[str, tuple[Plan, Estimate] | None, tuple[Plan, Estimate] | None]:
    """Why sharding is not tried ("" when it is), the sharded data-parallel candidate and the
    sharded-pipeline one (docs/planner.md, "Sharding"), given the best ``unsharded`` candidate
    and what the unsharded selection found (``stranded`` types, ``built`` templates, microbatch
    sizes ``ranked`` best first); ``bound`` ranks the device types by speed."""
    not_tried = _why_not_sharded(training, config, unsharded_fits=unsharded is not None)
    # Over every device, each type's devices alone, and the fastest types' devices.
    sharded = (
        None
        if not_tried
        else best_sharded_data_parallel(
            cluster,
            tables,
            training.global_batch_size,
            _microbatch_sizes(training),
            bound.samples_per_s_by_type,
        )
    )

    def place_sharded(level: Sharding) -> Plan | None:
        # Sharded pipelines on the types that fit nothing unsharded (every type when nothing
        # fits at all); two-type replicas were tried unsharded already where a plan fits.
        again = config if unsharded is None else replace(config, mixed=False)
        sel = _best_selection(
            tables, infos, training, again, sharded=level, stranded=stranded, built=built
        )
        return _placed(sel, cluster, training)

    def place_anywhere(level: Sharding) -> Plan | None:
        # Where an unsharded plan fits: pipelines that fit only sharded offered on every type,
        # for a shape that wins only once sharded (fewer stages, fewer bubbles), and the tp-1
        # pipelines that fit unsharded offered sharded too (their optimizer step divided across
        # their replicas, which may beat a tp > 1 replica); at the microbatch sizes where the
        # unsharded selections did best, as the mixed replicas are.
        sel = _best_selection(
            tables,
            infos,
            training,
            replace(config, mixed=False),
            sharded=level,
            stranded=set(infos),
            built=built,
            sizes=ranked[: config.mixed_microbatch_sizes],
            variants=True,
        )
        return _placed(sel, cluster, training)

    # Sharded pipeline stages: where the cost model says they pay, where a device type (or
    # the whole model) fits only sharded, and where a shape wins only sharded.
    piped = (
        None
        if not_tried
        else sharded_pipelines(
            cluster,
            tables,
            unsharded,
            needed=unsharded is None or bool(stranded),
            place_sharded=place_sharded,
            pays=not config.sharded_only_if_needed,
            place_anywhere=None if unsharded is None else place_anywhere,
        )
    )
    return not_tried, sharded, piped


def make_plan(
    cluster: Cluster,
    model: ModelSpec,
    training: TrainingSpec,
    profiles: ProfileSet | None = None,
    config: SearchConfig | None = None,
    *,
    runtime: RuntimePreset = ORCHESTRATOR,
) -> PlanResult:
    """Choose the fastest memory-feasible plan for ``model`` on ``cluster`` (executed by
    ``runtime``, whose memory constants the cost model uses).

    Raises :class:`~orchestrator.errors.InfeasibleError` when nothing fits, saying how much
    memory is missing on which device type.
    """
    if training.precision == AUTO_PRECISION:
        return _plan_auto(cluster, model, training, profiles, config, runtime)
    # Costed in the run's format; the chosen plan records it (None: training.precision unset).
    model, training = costed_inputs(model, training)
    started = time.perf_counter()
    config = config or SearchConfig()
    tables = CostTables.for_cluster(model, training, cluster, profiles, runtime=runtime)
    infos = type_infos(cluster, model, training, runtime)
    bound = fluid_bound(
        tables,
        cluster.device_counts,
        {d: list(i.tp_options) for d, i in infos.items()},
        training.global_batch_size,
    )
    stranded: set[str] = set()
    built: dict[int, dict[str, list[Template]]] = {}
    ranked: list[int] = []
    chosen = _best_selection(
        tables, infos, training, config, stranded=stranded, built=built, ranked_sizes=ranked
    )
    if chosen is None and not _may_shard(training, config):
        raise _nothing_fits(model, tables, infos)
    placed = [_placed(chosen, cluster, training)]
    if chosen is not None and _has_three_types(chosen):
        # The selection's score is not the full model's estimate: where it took a three-type
        # replica, the plan without any is costed beside it, and the estimate decides.
        two = replace(config, max_triple_depth_each=0)
        placed.append(_placed(_best_selection(tables, infos, training, two), cluster, training))
    candidates = [_costed(p, cluster, tables) for p in placed if p is not None]

    fastest_baseline = _fastest_type_only(cluster, tables, infos, training, config, bound)
    uniform = uniform_data_parallel(
        cluster, tables, training.global_batch_size, min(_microbatch_sizes(training))
    )
    for baseline in (fastest_baseline, uniform):
        if baseline.plan is not None and baseline.estimate is not None:
            candidates.append((baseline.plan, baseline.estimate))

    unsharded = min(
        (c for c in candidates if c[1].fits),
        key=lambda c: (c[1].step_time_s, c[0].to_json()),
        default=None,
    )
    not_tried, sharded, piped = _sharded_candidates(
        cluster, tables, infos, training, config, unsharded, stranded, built, ranked, bound
    )
    if sharded is not None:
        candidates.append(sharded)
    # Chosen only for a step MIN_GAIN shorter than unsharded (else only shown in the choices).
    if piped is not None and (
        unsharded is None or piped[1].step_time_s < unsharded[1].step_time_s * (1 - MIN_GAIN)
    ):
        candidates.append(piped)
    if not any(c[1].fits for c in candidates):
        raise _nothing_fits(model, tables, infos)

    # Ties go to the unsharded plan (it keeps every layer whole on one rank).
    plan, estimate = min(
        (c for c in candidates if c[1].fits),
        key=lambda c: (c[1].step_time_s, is_sharded(c[0]), c[0].to_json()),
    )
    choices = (
        sharding_line(
            plan,
            unsharded,
            sharded,
            not_tried,
            piped,
            _fits_unsharded(plan, cluster, tables),
            cluster.num_devices,
        ),
        tp_line(plan),
    )
    if estimate.step_time_s < bound.step_time_s * (1 - 1e-9):
        raise AssertionError(
            f"cost model bug: estimate {estimate.step_time_s:.6g} s is below the fluid bound "
            f"{bound.step_time_s:.6g} s"
        )
    if training.explicit_precision is not None:
        plan = plan.model_copy(update={"precision": training.explicit_precision})
    return PlanResult(
        plan=plan,
        estimate=estimate,
        bound=bound,
        baselines={"uniform_data_parallel": uniform, "fastest_type_only": fastest_baseline},
        search_time_s=time.perf_counter() - started,
        estimated_device_types=estimate.estimated_device_types,
        choices=choices,
    )

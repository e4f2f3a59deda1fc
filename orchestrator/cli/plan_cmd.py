"""``orchestrator plan`` and ``orchestrator estimate``: choose or cost a plan from files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchestrator.errors import SpecError

GiB = 1024**3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser(
        "plan",
        help="choose the fastest data x pipeline x tensor parallel plan for a cluster and model",
        description="Choose the fastest memory-feasible plan; show it beside the fluid bound and "
        "the uniform data-parallel and fastest-type-only baselines.",
    )
    _common(plan)
    plan.add_argument("--out", type=Path, help="write the plan JSON here (read by estimate, run)")
    plan.add_argument("--picture", type=Path, help="draw one training step to .svg or .png")
    plan.set_defaults(func=run_plan)

    est = sub.add_parser(
        "estimate",
        help="cost a given plan: step time, memory per device, whether it fits",
    )
    est.add_argument("--plan", type=Path, required=True, help="plan JSON (from `plan --out`)")
    _common(est)
    est.set_defaults(func=run_estimate)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", type=Path, required=True, help="cluster YAML/JSON")
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        help="model YAML/JSON, or a Hugging Face model folder (config.json)",
    )
    p.add_argument("--training", type=Path, help="training YAML/JSON (defaults in docs/formats.md)")
    p.add_argument(
        "--profiles",
        type=Path,
        nargs="+",
        default=[],
        metavar="DIR",
        help="measured profile files or directories (else built-in ones, else FLOP estimates)",
    )
    p.add_argument(
        "--no-builtin-profiles",
        action="store_true",
        help="ignore the profiles shipped with the package for known models",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _inputs(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    from orchestrator.spec.loading import load_cluster, load_model, load_training
    from orchestrator.spec.profiles import ProfileSet

    cluster = load_cluster(args.cluster).resolve()
    model = load_model(args.model)
    training = load_training(args.training)
    from orchestrator.cli.profile_filter import profiles_for_model

    profiles = profiles_for_model(args.profiles, model) if args.profiles else ProfileSet()
    if not args.no_builtin_profiles:
        profiles = ProfileSet([*_builtin_profiles(model.name).files, *profiles.files])
    return cluster, model, training, profiles


def _builtin_profiles(model_name: str) -> Any:
    from orchestrator.spec.profiles import ProfileSet

    try:
        from orchestrator.profiles.builtin import builtin_profiles
    except ImportError:
        return ProfileSet()
    try:
        return builtin_profiles(model_name)
    except (KeyError, FileNotFoundError, LookupError):
        return ProfileSet()


def _estimate_summary(est: Any) -> dict[str, Any] | None:
    if est is None:
        return None
    return {
        "step_time_s": est.step_time_s,
        "throughput_samples_per_s": est.throughput_samples_per_s,
        "peak_memory_bytes": est.peak_memory_bytes,
        "fits": est.fits,
    }


def _precision(plan: Any, cluster: Any, model: Any, training: Any) -> dict[str, str | None]:
    """The plan's precision (recorded in the plan, else the format ``training.precision`` names,
    else the model's dtype, as costed) against
    what its device types run well (``planner/precision.py``)."""
    from orchestrator.planner.precision import precision_summary

    planned = plan.precision or training.explicit_precision or model.dtype
    return precision_summary(planned, [cluster.device_types[t] for t in plan.device_counts()])


def run_plan(args: argparse.Namespace) -> int:
    from orchestrator.planner import make_plan

    if args.picture and args.picture.suffix.lower() not in (".svg", ".png"):
        raise SpecError(
            f"cannot draw to {args.picture.name}", field="--picture", fix="use a .svg or .png name"
        )
    from orchestrator.cli.out_paths import AllOrNothing, check_output_file

    # Checked before any work; then both files are written, or neither is.
    if args.out:
        check_output_file(args.out, "--out")
    if args.picture:
        check_output_file(args.picture, "--picture")
    cluster, model, training, profiles = _inputs(args)
    result = make_plan(cluster, model, training, profiles)
    precision = _precision(result.plan, cluster, model, training)
    outputs = AllOrNothing()
    try:
        if args.picture:
            from orchestrator.cli.picture import draw_step

            title = f"{model.name}: one step"
            outputs.stage(
                args.picture, lambda tmp: draw_step(result.plan, result.estimate, tmp, title=title)
            )
        if args.out:
            outputs.stage(args.out, lambda tmp: tmp.write_text(result.plan.to_json()))
        outputs.commit()
    finally:
        outputs.discard()
    if args.json:
        out = {
            "plan": json.loads(result.plan.to_json()),  # the written form
            "estimate": _estimate_summary(result.estimate),
            "bound": {"step_time_s": result.bound.step_time_s},
            "bound_ratio": result.bound_ratio,
            "baselines": {k: _estimate_summary(b.estimate) for k, b in result.baselines.items()},
            "baseline_reasons": {k: b.reason for k, b in result.baselines.items()},
            "search_time_s": result.search_time_s,
            "estimated_device_types": list(result.estimated_device_types),
            "choices": list(result.choices),
            "devices": result.estimate.to_dict()["devices"],
            "precision": precision,
        }
        if result.precision_choice is not None:
            out["precision_auto"] = result.precision_choice.to_dict()
        json.dump(out, sys.stdout, indent=2, sort_keys=True)
        print()
        return 0
    from orchestrator.cli.plan_view import print_plan_result

    print_plan_result(result, model, training, precision=precision)
    if args.out:
        print(f"plan written to {args.out}")
    if args.picture:
        print(f"picture written to {args.picture}")
    return 0


def run_estimate(args: argparse.Namespace) -> int:
    from orchestrator.costmodel import estimate_plan
    from orchestrator.spec.loading import load_plan

    cluster, model, training, profiles = _inputs(args)
    plan = load_plan(args.plan)
    from orchestrator.cli.plan_checks import check_plan_fits

    check_plan_fits(plan, cluster, model, training if args.training is not None else None)
    plan.check_against(model.num_planner_layers, cluster.device_counts)
    plan.check_layouts(model.num_heads, model.ffn_size, cluster.max_devices_per_node)
    for r, rep in enumerate(plan.replicas):
        for s, stage in enumerate(rep.stages):
            if stage.node is not None and stage.node not in cluster.node_by_name:
                raise SpecError(
                    f"node {stage.node!r} is not in the cluster",
                    field=f"plan.replicas[{r}].stages[{s}].node",
                    fix="remove the node field or re-plan for this cluster",
                )
    from orchestrator.planner.auto_precision import with_auto_precision

    plan = with_auto_precision(plan, training, cluster.device_types)
    est = estimate_plan(plan, cluster, model, training, profiles)
    # What the estimate was costed in (costmodel/precision.py).
    costed = plan.precision or training.explicit_precision or model.dtype
    if args.json:
        out = est.to_dict()
        out["precision"] = costed.value
        json.dump(out, sys.stdout, indent=2, sort_keys=True)
        print()
        return 0
    from orchestrator.cli.plan_view import print_estimate

    print_estimate(plan, est)
    print(f"costed in {costed}" + (" (the plan's precision)" if plan.precision else ""))
    return 0

"""``orchestrator profiles import``: convert public per-layer profiles into the project's format.

Every flag value is checked here, before anything is read or written; a bad one is one line
naming the flag and the fix (exit code 2). Converted files are written only when the whole
import succeeded, each to a temporary name first.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import SpecError

if TYPE_CHECKING:
    from orchestrator.spec.devices import Dtype

FORMATS = ("sailor", "cephalo")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "profiles",
        help="convert measured per-layer profiles",
        description="Work with per-layer profiles (docs/formats.md, section Profile).",
    )
    sub = parser.add_subparsers(dest="profiles_command", metavar="ACTION", required=True)
    imp = sub.add_parser(
        "import",
        help="convert Sailor or Cephalo profiles into the project's format",
        description=(
            "Convert the public Sailor (per-layer, per-GPU) or Cephalo (one transformer layer, "
            "many GPUs) profiles into orchestrator-profile/v1 files, OUT/<model>/<device>.json. "
            "GPU names are mapped onto the device catalog; names it lacks are skipped with a "
            "warning."
        ),
    )
    imp.add_argument(
        "src",
        metavar="SRC",
        help=(
            "sailor: the folder holding profiles/<MODEL>/<GPU>/profile.json (and llm_info.json for "
            "memory figures); cephalo: model_latencies.json or the folder holding it"
        ),
    )
    imp.add_argument("--format", required=True, metavar="FORMAT", help="sailor or cephalo")
    imp.add_argument("--out", required=True, metavar="DIR", help="output folder")
    imp.add_argument(
        "--model",
        help=(
            "the model's name in the source (sailor: a folder under profiles/, default every one; "
            "cephalo: a key of model_latencies.json, required, e.g. deepspeedgpt_2.7b)"
        ),
    )
    imp.add_argument(
        "--name",
        help=(
            "the model name written into the profiles; must equal the model file's `name` "
            "(default: --model)"
        ),
    )
    imp.add_argument(
        "--gpus",
        metavar="LIST",
        help=("comma-separated source GPU names to convert (default: every one the catalog knows)"),
    )
    imp.add_argument(
        "--sequence-length",
        metavar="N",
        help=(
            "tokens per sample; cephalo: required, picks the measurement; sailor: recorded "
            "(Sailor profiled at 2048)"
        ),
    )
    imp.add_argument(
        "--dtype",
        metavar="D",
        help=(
            "fp32, fp16 or bf16; cephalo: required, picks the measurement; sailor: element size of "
            "the memory figures, default fp16"
        ),
    )
    imp.add_argument(
        "--num-layers",
        metavar="N",
        help=(
            "transformer blocks of the model; cephalo: blocks 1..N get the measured layer (default "
            "from model_stats.json beside SRC); sailor: checked against each profile"
        ),
    )
    imp.add_argument(
        "--microbatch-sizes",
        metavar="LIST",
        help=(
            "comma-separated microbatch sizes to keep (cephalo default 1,2,4,8; sailor default all)"
        ),
    )
    imp.set_defaults(func=run_import)


def _positive_int(text: str | None, flag: str) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0 or str(value) != text.strip():
        raise SpecError(f"{text!r} is not a positive integer", field=flag, fix=f"e.g. {flag} 512")
    return value


def _int_list(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    values = [_positive_int(p, flag) for p in parts if p] if all(parts) else []
    if not values:
        raise SpecError(
            f"{text!r} is not a list of positive integers", field=flag, fix=f"e.g. {flag} 1,2,4"
        )
    return sorted({v for v in values if v is not None})


def _name_list(text: str | None, flag: str) -> list[str] | None:
    if text is None:
        return None
    names = [p.strip() for p in text.split(",")]
    if not all(names):
        raise SpecError(f"{text!r} has an empty name", field=flag, fix=f"e.g. {flag} a100x40,t4")
    return names


def _dtype(text: str | None) -> Dtype | None:
    from orchestrator.spec.devices import Dtype

    if text is None:
        return None
    try:
        return Dtype(text.strip().lower())
    except ValueError:
        raise SpecError(
            f"unknown dtype {text!r}", field="--dtype", fix="use fp32, fp16 or bf16"
        ) from None


def run_import(args: argparse.Namespace) -> int:
    from orchestrator.profiles.cephalo import DEFAULT_MICROBATCH_SIZES, import_cephalo
    from orchestrator.profiles.output import write_profiles
    from orchestrator.profiles.sailor import SAILOR_DEFAULT_DTYPE, import_sailor

    fmt = args.format.strip().lower()
    if fmt not in FORMATS:
        raise SpecError(
            f"unknown format {args.format!r}", field="--format", fix="use sailor or cephalo"
        )
    src, out = Path(args.src), Path(args.out)
    if not src.exists():
        raise SpecError(f"no such file or directory: {src}", field="SRC", fix="check the path")
    if out.exists() and not out.is_dir():
        raise SpecError(f"{out} exists and is not a folder", field="--out", fix="pass a folder")
    from orchestrator.cli.out_paths import check_output_dir

    check_output_dir(out, "--out")
    seq = _positive_int(args.sequence_length, "--sequence-length")
    layers = _positive_int(args.num_layers, "--num-layers")
    mbs = _int_list(args.microbatch_sizes, "--microbatch-sizes")
    gpus = _name_list(args.gpus, "--gpus")
    dtype = _dtype(args.dtype)
    if args.name is not None and not args.name.strip():
        raise SpecError("empty model name", field="--name", fix="e.g. --name GPT-2.7B-s512")
    if fmt == "sailor":
        result = import_sailor(
            src,
            model=args.model,
            name=args.name,
            gpus=gpus,
            dtype=dtype or SAILOR_DEFAULT_DTYPE,
            sequence_length=seq,
            num_layers=layers,
            microbatch_sizes=mbs,
        )
    else:
        for flag, value in (
            ("--model", args.model),
            ("--sequence-length", seq),
            ("--dtype", dtype),
        ):
            if value is None:
                raise SpecError(
                    "required for --format cephalo",
                    field=flag,
                    fix="e.g. --model deepspeedgpt_2.7b --sequence-length 512 --dtype fp32",
                )
        result = import_cephalo(
            src,
            model=args.model,
            name=args.name,
            gpus=gpus,
            sequence_length=seq,
            dtype=dtype,
            num_layers=layers,
            microbatch_sizes=mbs or DEFAULT_MICROBATCH_SIZES,
        )
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    written = _write_all_or_nothing(result.profiles, out, write_profiles)
    print(f"wrote {len(written)} profile(s) under {out}:")
    for path, profile in zip(
        written, sorted(result.profiles, key=lambda p: (p.model, p.device_type)), strict=True
    ):
        sizes = sorted({e.microbatch_size for e in profile.entries})
        tps = sorted({e.tp for e in profile.entries})
        print(
            f"  {path}  model={profile.model} device={profile.device_type} "
            f"microbatch={','.join(map(str, sizes))} tp={','.join(map(str, tps))}"
        )
    return 0


def _write_all_or_nothing(profiles: Any, out: Path, write: Any) -> list[Path]:
    """Write every profile into a staging folder beside ``out``, then rename them into place:
    a failure while writing leaves ``out`` as it was."""
    import shutil
    import tempfile

    anchor = out
    while not anchor.exists():
        anchor = anchor.parent
    staging = Path(tempfile.mkdtemp(prefix=".orchestrator-import-", dir=anchor))
    try:
        staged = write(profiles, staging)
        final = [out / p.relative_to(staging) for p in staged]
        for src, dst in zip(staged, final, strict=True):
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
        return final
    finally:
        shutil.rmtree(staging, ignore_errors=True)

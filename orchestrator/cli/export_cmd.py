"""``orchestrator export JOB.yaml --out DIR``: the job's newest checkpoint as a Hugging Face folder.

For jobs whose model is ``huggingface: FOLDER``: the folder written holds that model's
config.json (and tokenizer files) and the trained weights under the model's own names, so
``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` loads it.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a trained Hugging Face model folder from a job's checkpoint",
        description=(
            "Export the newest good checkpoint of a job whose model is a Hugging Face folder "
            "as a folder AutoModelForCausalLM.from_pretrained loads (docs/models.md)."
        ),
    )
    parser.add_argument("job", type=Path, help="job spec (YAML or JSON)")
    parser.add_argument("--out", type=Path, required=True, help="folder to create")
    parser.add_argument(
        "--checkpoint", type=Path, help="checkpoint root (default: the job's checkpoint.dir)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.errors import UserError
    from orchestrator.runtime.jobs import load_job

    job = load_job(args.job)
    if job.model.huggingface is None:
        raise UserError(
            "the job's model is not a Hugging Face folder",
            field="model.huggingface",
            fix="export works for jobs with model: {huggingface: DIR}",
        )
    root = args.checkpoint
    if root is None:
        if job.checkpoint is None:
            raise UserError(
                "the job has no checkpoint section",
                field="--checkpoint",
                fix="pass --checkpoint DIR or set checkpoint.dir in the job",
            )
        root = job.resolve_path(job.checkpoint.dir, args.job)
    if args.out.exists():
        raise UserError(f"{args.out} already exists", field="--out", fix="choose a new folder")
    from orchestrator.models.hf_export import export_checkpoint

    out, step = export_checkpoint(job.model.kwargs["path"], root, args.out)
    print(f"exported step {step} of {job.model.shape.name} to {out}")
    return 0

"""``orchestrator data prepare``: tokenize a text corpus into a token file (docs/models.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "data", help="prepare training data", description="Prepare training data."
    )
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    prep = sub.add_parser(
        "prepare",
        help="tokenize a text corpus into a token file",
        description=(
            "Tokenize UTF-8 text into a flat binary of token ids (uint16 when the vocabulary "
            "fits, else uint32) that a job reads with data: {tokens: FILE, dtype: ...}; "
            "FILE.json beside it records the dtype and vocabulary size."
        ),
    )
    prep.add_argument(
        "--input", type=Path, help="text corpus (default: the corpus shipped with the package)"
    )
    prep.add_argument(
        "--hf-dataset", type=Path, help="a Hugging Face dataset saved to disk (instead of --input)"
    )
    prep.add_argument("--column", default="text", help="the dataset's text or token-id column")
    prep.add_argument("--split", default="train", help="the dataset's split, if it has splits")
    prep.add_argument("--out", type=Path, required=True, help="token file to write")
    prep.add_argument(
        "--tokenizer", type=Path, help="a Hugging Face tokenizer folder (default: bytes, 256 ids)"
    )
    prep.add_argument("--no-progress", action="store_true", help="no progress bar")
    prep.set_defaults(func=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    from orchestrator.errors import UserError
    from orchestrator.models.hf_tokenize import prepare_from_hf_dataset, prepare_tokens

    if args.hf_dataset is not None:
        if args.input is not None:
            raise UserError(
                "give --input or --hf-dataset, not both", field="--hf-dataset", fix="drop one"
            )
        done = prepare_from_hf_dataset(
            args.hf_dataset,
            args.column,
            args.out,
            args.tokenizer,
            split=args.split,
            progress=not args.no_progress,
        )
        print(
            f"wrote {done.path}: {done.num_tokens} tokens, {done.dtype}, "
            f"vocabulary {done.vocab_size}"
        )
        return 0
    source = args.input
    if source is None:
        from orchestrator.worker.data import BUILTIN_CORPUS

        source = Path(__file__).resolve().parent.parent / "data" / "corpus" / BUILTIN_CORPUS
    done = prepare_tokens(source, args.out, args.tokenizer, progress=not args.no_progress)
    print(
        f"wrote {done.path}: {done.num_tokens} tokens, {done.dtype}, vocabulary {done.vocab_size}",
        file=sys.stdout,
    )
    return 0

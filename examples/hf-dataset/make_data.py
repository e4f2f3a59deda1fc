"""Make this example's data: the shipped corpus as a saved Hugging Face dataset (one verse a row,
a ``text`` column) and a byte-level BPE tokenizer of 512 ids trained on it, both offline.

    python examples/hf-dataset/make_data.py            # writes genesis/ and tokenizer/ here
    python examples/hf-dataset/make_data.py --out DIR  # or into DIR

A dataset of your own is any folder written by ``Dataset.save_to_disk``; a tokenizer, any folder
written by ``save_pretrained`` (the model's own tokenizer, usually shipped with the model).
"""

from __future__ import annotations

import argparse
from pathlib import Path

VOCAB_SIZE = 512  # as tiny-llama/config.json
EOS = "<|endoftext|>"  # id 0: the first special token


def verses() -> list[str]:
    """The corpus's verses without their references ("Ge1:1 In the beginning ...")."""
    from orchestrator.worker.data import builtin_corpus_bytes

    lines = builtin_corpus_bytes().decode("utf-8").splitlines()
    return [line.split(" ", 1)[1] for line in lines if " " in line]


def make(out: Path) -> None:
    from datasets import Dataset
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = verses()
    Dataset.from_dict({"text": texts}).save_to_disk(str(out / "genesis"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS).save_pretrained(
        str(out / "tokenizer")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    make(parser.parse_args().out)


if __name__ == "__main__":
    main()

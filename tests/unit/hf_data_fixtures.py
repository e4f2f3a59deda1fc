"""A tiny saved Hugging Face dataset and a tokenizer built offline (no downloads)."""

from __future__ import annotations

from pathlib import Path

DOCUMENTS = [
    "in the beginning god created the heaven and the earth",
    "and the earth was without form and void",
    "and darkness was upon the face of the deep",
    "and the spirit of god moved upon the face of the waters",
    "and god said let there be light and there was light",
]


def make_tokenizer(folder: Path, corpus: list[str] = DOCUMENTS, extra_words: int = 0) -> Path:
    """A word-level tokenizer trained on ``corpus``, saved as a transformers tokenizer folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    words = [f"extra{i}" for i in range(extra_words)]
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "<eos>"])
    tok.train_from_iterator([*corpus, *words], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>")
    fast.save_pretrained(str(folder))
    return folder


def make_dataset(folder: Path, documents: list[str] = DOCUMENTS, repeat: int = 1) -> Path:
    """A saved dataset with a text column and a token-id column."""
    from datasets import Dataset

    texts = [d for _ in range(repeat) for d in documents]
    ids = [[(7 * i + j) % 50 for j in range(3 + i % 5)] for i in range(len(texts))]
    Dataset.from_dict({"text": texts, "input_ids": ids}).save_to_disk(str(folder))
    return folder

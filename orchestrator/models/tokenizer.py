"""Byte-level tokenizer: each UTF-8 byte is a token (vocabulary 256), nothing to train or ship."""

from __future__ import annotations

VOCAB_SIZE = 256


def encode(text: str) -> bytes:
    """Token ids of ``text`` (its UTF-8 bytes)."""
    return text.encode("utf-8")


def decode(ids: bytes | bytearray | list[int]) -> str:
    """Text of token ids; bytes that do not form valid UTF-8 become U+FFFD."""
    return bytes(ids).decode("utf-8", errors="replace")

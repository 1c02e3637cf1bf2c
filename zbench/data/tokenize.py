"""Tokenizers: a Hugging Face tokenizer when one is named and transformers is installed, else bytes.

The byte tokenizer needs no files and no network, so real text (MRPC, local corpora) trains a
random-init model anywhere; its ids fit any vocabulary of at least 259 entries.
"""

from __future__ import annotations

from typing import Protocol


class Tokenizer(Protocol):
    name: str
    pad_id: int
    cls_id: int
    sep_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...  # special tokens left out


class ByteTokenizer:
    """UTF-8 bytes shifted past three specials: pad 0, cls 1, sep 2."""

    name = "bytes"
    pad_id, cls_id, sep_id = 0, 1, 2
    offset = 3
    vocab_size = 256 + offset

    def encode(self, text: str) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        # a cut at target_len can split a character: replace the broken bytes rather than fail
        return bytes(i - self.offset for i in ids if self.offset <= i < self.vocab_size).decode(
            "utf-8", errors="replace"
        )


class HFTokenizer:
    """A transformers tokenizer behind the same small interface."""

    def __init__(self, name_or_path: str) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(name_or_path)
        self.name = name_or_path
        self.vocab_size = len(self.tok)
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else (self.tok.eos_token_id or 0)
        self.cls_id = (
            self.tok.cls_token_id if self.tok.cls_token_id is not None else (self.tok.bos_token_id or self.pad_id)
        )
        self.sep_id = (
            self.tok.sep_token_id if self.tok.sep_token_id is not None else (self.tok.eos_token_id or self.pad_id)
        )

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode([i for i in ids if 0 <= i < self.vocab_size], skip_special_tokens=True)


def load_tokenizer(name_or_path: str | None) -> Tokenizer:
    """The named HF tokenizer, or bytes when none is named."""
    return HFTokenizer(name_or_path) if name_or_path else ByteTokenizer()


def pair_ids(tok: Tokenizer, a: str, b: str, length: int) -> tuple[list[int], list[int]]:
    """[cls] a [sep] b [sep], cut to `length` (the longer sentence loses tokens first) and padded."""
    ia, ib = tok.encode(a), tok.encode(b)
    room = max(0, length - 3)
    while len(ia) + len(ib) > room:
        if len(ia) >= len(ib):
            ia.pop()
        else:
            ib.pop()
    ids = [tok.cls_id, *ia, tok.sep_id, *ib, tok.sep_id][:length]
    mask = [1] * len(ids) + [0] * (length - len(ids))
    return ids + [tok.pad_id] * (length - len(ids)), mask

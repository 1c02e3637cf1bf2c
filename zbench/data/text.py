"""Local text files cut into language-model blocks."""

from __future__ import annotations

import os

import torch

from zero_core import ConfigError

from .tokenize import ByteTokenizer, Tokenizer


def too_short(n_tokens: int, seq_len: int) -> str | None:
    """Why `n_tokens` cannot train and evaluate at `seq_len` (a train block and an eval block), or None."""
    if n_tokens // (seq_len + 1) < 2:
        return (f"data.text_files hold {n_tokens} tokens: fewer than two blocks of seq_len + 1 = {seq_len + 1}; "
                "add text or lower seq_len")
    return None


def byte_tokens(paths: list[str], seq_len: int) -> int | None:
    """How many tokens the byte tokenizer makes of `paths` (with a separator after each file), counted only where
    that can be too few for `too_short`; None when the sizes alone show enough. Two bytes of a file make at least
    one token ("\\r\\n" reads as "\\n"; a byte that is not UTF-8 as U+FFFD, three), so only files smaller than
    four blocks are read."""
    if sum(os.path.getsize(p) for p in paths) >= 4 * (seq_len + 1):
        return None
    return sum(len(ByteTokenizer().encode(_read(p))) + 1 for p in paths)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def load_text_blocks(paths: list[str], tok: Tokenizer, seq_len: int, eval_fraction: float
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Concatenate the files, tokenize, cut into blocks of seq_len + 1, hold out the last blocks."""
    ids: list[int] = []
    for path in paths:
        ids.extend(tok.encode(_read(path)))
        ids.append(tok.sep_id)  # a document boundary
    n_blocks = len(ids) // (seq_len + 1)
    problem = too_short(len(ids), seq_len)
    if problem:
        raise ConfigError(problem)
    blocks = torch.tensor(ids[: n_blocks * (seq_len + 1)], dtype=torch.long).view(n_blocks, seq_len + 1)
    n_eval = max(1, int(round(n_blocks * eval_fraction)))

    def split(rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"input_ids": rows[:, :-1].contiguous(), "labels": rows[:, 1:].contiguous()}

    return split(blocks[:-n_eval]), split(blocks[-n_eval:])

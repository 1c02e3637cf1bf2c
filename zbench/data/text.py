"""Local text files cut into language-model blocks."""

from __future__ import annotations

import torch

from zero_core import ConfigError

from .tokenize import Tokenizer


def load_text_blocks(paths: list[str], tok: Tokenizer, seq_len: int, eval_fraction: float
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Concatenate the files, tokenize, cut into blocks of seq_len + 1, hold out the last blocks."""
    ids: list[int] = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            ids.extend(tok.encode(f.read()))
        ids.append(tok.sep_id)  # a document boundary
    n_blocks = len(ids) // (seq_len + 1)
    if n_blocks < 2:
        raise ConfigError(f"data.text_files hold {len(ids)} tokens: fewer than two blocks of seq_len + 1 = "
                          f"{seq_len + 1}; add text or lower seq_len")
    blocks = torch.tensor(ids[: n_blocks * (seq_len + 1)], dtype=torch.long).view(n_blocks, seq_len + 1)
    n_eval = max(1, int(round(n_blocks * eval_fraction)))

    def split(rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"input_ids": rows[:, :-1].contiguous(), "labels": rows[:, 1:].contiguous()}

    return split(blocks[:-n_eval]), split(blocks[-n_eval:])

"""Learnable synthetic data for every task, deterministic in the seed.

Uniform random tokens teach nothing; these follow rules a model can learn, so the loss falls and the
loss curves of two engines can be compared step by step.
"""

from __future__ import annotations

import torch

FIRST_ID = 4  # keep clear of the usual special-token ids (pad/bos/eos/unk)


def synthetic_tokens(gen: torch.Generator, batch: int, length: int, vocab: int) -> torch.Tensor:
    """Each row counts from a random start by a random stride (mod vocab), so the loss falls as the
    model learns the rule, unlike uniform random tokens."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, 8, (batch, 1), generator=gen)
    return (start + stride * torch.arange(length)) % vocab


def synthetic_split(task: str, n: int, seq_len: int, vocab: int, seed: int, *, num_labels: int = 2,
                    target_len: int | None = None, lengths: dict | None = None) -> dict[str, torch.Tensor]:
    """`n` rows for `task` as the tensors the batch iterator and the models take. `lengths` ({mean, std,
    min}): rows of normal random length, clipped to [min, seq_len], right-padded (id 0, attention_mask 0;
    token labels -100 there, which the loss ignores)."""
    gen = torch.Generator().manual_seed(seed)
    if task == "lm":
        rows = synthetic_tokens(gen, n, seq_len + 1, vocab)
        return {"input_ids": rows[:, :-1].contiguous(), "labels": rows[:, 1:].contiguous()}
    span = max(1, vocab - FIRST_ID)
    start = torch.randint(0, span, (n, 1), generator=gen)
    stride = torch.randint(1, 8, (n, 1), generator=gen)
    total = seq_len + (target_len or seq_len)
    seq = FIRST_ID + (start + stride * torch.arange(total)) % span
    ids = seq[:, :seq_len].contiguous()
    mask = torch.ones_like(ids)
    if task == "classification":
        labels = (stride.squeeze(1) % num_labels).long()  # the stride decides the class
    elif task == "token_classification":
        labels = ids % num_labels  # each token id maps to a fixed tag
    elif task == "seq2seq":
        labels = seq[:, seq_len:].contiguous()  # continue the sequence
    else:
        raise ValueError(f"unknown task {task!r}")
    if lengths is not None:  # drawn last: rows of the same seed keep their tokens and labels
        draw = torch.randn(n, generator=gen) * lengths["std"] + lengths["mean"]
        keep = draw.round().clamp(min=lengths.get("min", 8), max=seq_len).long()
        mask = (torch.arange(seq_len) < keep[:, None]).long()
        ids = ids * mask
        if task == "token_classification":
            labels = labels.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}

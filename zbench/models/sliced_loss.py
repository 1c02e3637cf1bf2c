"""Next-token cross-entropy over a large vocabulary, a slice of tokens at a time.

A 7 B GPT's step of 32 x 1024 tokens over GPT-2's 50,257 tokens has 6.6 GB of fp32 logits; their
log-softmax (saved for backward) and the two gradients in backward take as much again each, so for a
moment at the end of forward and the start of backward the loss holds about 20 GB. Here each slice's
logits exist only while that slice's loss is taken, and again while its gradient is (recomputed in
backward, as activation checkpointing does for blocks): a few hundred MB at a time, for one more head
matmul. The loss is the same mean over the tokens not ignored; only the order of its sum differs.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100  # F.cross_entropy's default: padded label positions
SLICE_BYTES = 512 << 20  # fp32 logits of one slice; ZBENCH_LOSS_SLICE_BYTES overrides it (tests, tuning)


def slice_bytes() -> int:
    text = os.environ.get("ZBENCH_LOSS_SLICE_BYTES")
    if text is None:
        return SLICE_BYTES
    if not text.isdigit() or int(text) == 0:
        raise ValueError(f"ZBENCH_LOSS_SLICE_BYTES must be a positive whole number of bytes, not {text!r}")
    return int(text)


def tokens_per_slice(vocab: int) -> int:
    return max(1, slice_bytes() // (4 * vocab))


def worth_slicing(tokens: int, vocab: int) -> bool:
    """More than one slice's worth of fp32 logits: below that, one plain cross-entropy is the same memory."""
    return tokens > tokens_per_slice(vocab)


def _slice_loss(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # the head is called as a module, so engines that gather its weight in forward hooks do so here too
    return F.cross_entropy(head(hidden).float(), targets, reduction="sum", ignore_index=IGNORE_INDEX)


def sliced_cross_entropy(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean(cross_entropy(head(hidden), targets)) over tokens whose target is not IGNORE_INDEX (NaN when
    there are none, as F.cross_entropy), with no more than slice_bytes() of fp32 logits alive at once."""
    h, t = hidden.flatten(0, -2), targets.reshape(-1)
    per = tokens_per_slice(head.weight.shape[0])
    total = sum(
        checkpoint(_slice_loss, head, h[a : a + per], t[a : a + per], use_reentrant=False)
        for a in range(0, t.numel(), per)
    )
    return total / (t != IGNORE_INDEX).sum()

"""Per-rank batches: every engine sees exactly the same rows in the same order, for loss parity.

Training reads an endless stream of shuffled passes over the split (a new permutation per pass,
seeded), cut into global batches of batch * world rows; rank r takes its slice. A batch larger
than the split just spans passes, so the batch search can try any size. Evaluation pads the split to
whole global batches with masked-out rows, so every rank runs the same number of forwards (stage 3
and FSDP2 gather weights collectively inside each forward).
"""

from __future__ import annotations

from typing import Iterator

import torch

Batch = dict[str, torch.Tensor]


def rows(split: Batch) -> int:
    return next(iter(split.values())).shape[0]


def steps_per_epoch(split: Batch, batch: int, world: int) -> int:
    """Full global batches in one pass (at least one)."""
    return max(1, rows(split) // (batch * world))


def train_stream(split: Batch, *, batch: int, rank: int, world: int, seed: int, start: int = 0) -> Iterator[Batch]:
    """This rank's micro-batches from global batch `start` on, forever."""
    n, global_batch = rows(split), batch * world
    order = torch.empty(0, dtype=torch.long)
    passes = 0
    i = start
    while True:
        need = (i + 1) * global_batch
        while order.numel() < need:
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + passes))
            order = torch.cat([order, perm])
            passes += 1
        idx = order[i * global_batch + rank * batch : i * global_batch + (rank + 1) * batch]
        yield {k: v[idx] for k, v in split.items()}
        i += 1


def eval_batches(split: Batch, *, batch: int, rank: int, world: int) -> Iterator[tuple[Batch, torch.Tensor]]:
    """(micro-batch, valid-row mask) pairs; every rank yields the same number of them."""
    n, global_batch = rows(split), batch * world
    n_batches = -(-n // global_batch)
    for b in range(n_batches):
        idx = torch.arange(b * global_batch + rank * batch, b * global_batch + (rank + 1) * batch)
        valid = idx < n
        safe = torch.where(valid, idx, torch.zeros_like(idx))
        yield {k: v[safe] for k, v in split.items()}, valid


def truncate(split: Batch, limit: int | None) -> Batch:
    return split if limit is None else {k: v[:limit] for k, v in split.items()}


def trim_padding(b: Batch) -> Batch:
    """Cut a right-padded batch to its longest row (Hugging Face's DataCollatorWithPadding without
    pad_to_max_length): every tensor as wide as the attention mask loses the all-padding columns."""
    mask = b.get("attention_mask")
    if mask is None:
        return b
    width = mask.shape[1]
    keep = max(1, int(mask.sum(dim=1).max()))
    if keep == width:
        return b
    return {k: v[:, :keep] if v.dim() == 2 and v.shape[1] == width else v for k, v in b.items()}


def widest_batch(split: Batch, *, batch: int, rank: int, world: int, seed: int, micro_steps: int) -> Batch:
    """The widest (longest-row) micro-batch this rank meets in the first `micro_steps` of its stream: with
    dynamic padding the batch search tries this one, so a batch that fits it fits the whole run."""
    stream = train_stream(split, batch=batch, rank=rank, world=world, seed=seed)
    return max(
        (next(stream) for _ in range(max(1, micro_steps))), key=lambda b: int(b["attention_mask"].sum(dim=1).max())
    )

"""Greedy generation for seq2seq evaluation, through the variant's own forward.

Every step calls the wrapped model exactly as training does (`variant.forward`), so each engine
gathers its sharded weights the way it does for a training forward (zero_core stage 3 and FSDP2
gather in forward hooks; DDP and stages 0-2 hold full weights): no engine needs a generation path
of its own. The first step runs the encoder; later steps pass its output back (`encoder_outputs`),
so only the decoder runs again. There is no key/value cache: step t re-reads t decoder positions,
which costs more than `model.generate` but keeps every engine on the code path it is measured on.
Every rank runs the same number of steps (a sharded forward is collective): generation stops when
all rows on all ranks have produced the end token, or at `max_len`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

Forward = Callable[[dict[str, Any]], Any]


def special_ids(config: Any, tokenizer: Any) -> tuple[int, int, int]:
    """(decoder start, end, pad) token ids from a transformers config, falling back to the tokenizer's."""
    pad = config.pad_token_id if config.pad_token_id is not None else tokenizer.pad_id
    eos = config.eos_token_id if config.eos_token_id is not None else tokenizer.sep_id
    start = getattr(config, "decoder_start_token_id", None)
    start = start if start is not None else (config.bos_token_id if config.bos_token_id is not None else pad)
    return int(start), int(eos if not isinstance(eos, list) else eos[0]), int(pad)


def _any_running(done: torch.Tensor) -> bool:
    running = (~done).sum().reshape(1).to(torch.float32)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(running)
    return bool(running.item() > 0)


@torch.no_grad()
def greedy_generate(forward: Forward, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_len: int,
                    start_id: int, eos_id: int, pad_id: int) -> torch.Tensor:
    """[B, <= max_len] generated ids (the start token left out); after a row's end token: pad."""
    rows = input_ids.shape[0]
    dec = torch.full((rows, 1), start_id, dtype=torch.long, device=input_ids.device)
    done = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
    encoder_outputs = None
    for _ in range(max_len):
        batch: dict[str, Any] = {"attention_mask": attention_mask, "decoder_input_ids": dec}
        if encoder_outputs is None:
            batch["input_ids"] = input_ids
        else:
            batch["encoder_outputs"] = encoder_outputs
        out = forward(batch)
        if encoder_outputs is None and getattr(out, "encoder_last_hidden_state", None) is not None:
            encoder_outputs = (out.encoder_last_hidden_state,)
        nxt = out.logits[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        done |= nxt == eos_id
        dec = torch.cat([dec, nxt[:, None]], dim=1)
        if not _any_running(done):
            break
    return dec[:, 1:]


def strip_generated(ids: list[int], eos_id: int) -> list[int]:
    """Generated ids up to (not including) the first end token."""
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


class TextGeneration:
    """Greedy hypotheses and their references, as text, for the valid rows of seq2seq eval batches."""

    def __init__(self, forward: Forward, tokenizer: Any, config: Any, max_len: int) -> None:
        self.forward, self.tokenizer, self.max_len = forward, tokenizer, max_len
        self.start_id, self.eos_id, self.pad_id = special_ids(config, tokenizer)

    @classmethod
    def for_run(cls, task: str, tokenizer: Any, model: Any, forward: Forward, max_len: int) -> TextGeneration | None:
        """Only seq2seq on real text (a tokenizer to read it back) with a transformers model: BLEU on
        synthetic tokens would measure nothing."""
        config = getattr(model, "config", None)
        if task != "seq2seq" or tokenizer is None or config is None:
            return None
        return cls(forward, tokenizer, config, max_len)

    def texts(self, batch: dict[str, torch.Tensor], valid: torch.Tensor) -> tuple[list[str], list[str]]:
        """(hypotheses, references) of the batch's valid rows; every rank must call it (collective)."""
        gen = greedy_generate(self.forward, batch["input_ids"], batch["attention_mask"], max_len=self.max_len,
                              start_id=self.start_id, eos_id=self.eos_id, pad_id=self.pad_id)
        keep = valid.tolist()
        hyps = [self.tokenizer.decode(strip_generated(g, self.eos_id)) for g, k in zip(gen.tolist(), keep) if k]
        refs = [self.tokenizer.decode(strip_generated([i for i in r if i >= 0], self.eos_id))
                for r, k in zip(batch["labels"].tolist(), keep) if k]
        return hyps, refs

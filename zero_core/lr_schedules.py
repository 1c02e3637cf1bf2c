"""Learning-rate schedules as pure tensor functions of the number of updates already applied.

`make_lr_schedule(cfg)(applied)` gives the lr for the next update, where `applied` (a float32 0-d or
1-element tensor on any device) counts the optimizer updates applied so far: 0 for the very first.
Only tensor ops, no `.item()` and no Python branching on values, so it runs on the GPU without a sync.

What DeepSpeed does (read in microsoft/DeepSpeed):
- deepspeed/runtime/engine.py, `_take_model_step`: `optimizer.step()` runs first; then, only if the
  optimizer reports no overflow, `lr_scheduler.step()`. An fp16 overflow step therefore does not
  advance the schedule (`skipped_steps += 1` instead). The engine never steps the scheduler at
  initialisation (`_configure_lr_scheduler` only builds it). So the schedule is a function of APPLIED
  updates: the engine must pass a counter that skips overflow steps, which the optimizer's `applied` is.
- deepspeed/runtime/lr_schedules.py, `WarmupLR.__init__`: with last_batch_iteration == -1 it writes
  `get_lr()` into the optimizer, and `get_lr()` returns warmup_min_lr while last_batch_iteration < 0
  (added by DeepSpeed PR #6597, Oct 2024; before it the first update used optimizer.params.lr). With
  last_batch_iteration >= 0 (a resume) nothing is written and the first update uses optimizer.params.lr.
  `step()` increments last_batch_iteration and then sets the lr, so update n >= 1 runs at
  iteration it = last_batch_iteration + n (with the default -1: update 1 uses it = 0, i.e. min lr again).
- lr = warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma(it), with W = max(2, warmup_num_steps):
    it < W, "log":    gamma = log(it + 1) / log(W)
    it < W, "linear": gamma = it / W
    it >= W: WarmupLR gamma = 1; WarmupDecayLR gamma = max(0, (T - it) / max(1, T - W)), T = total_num_steps
  (so WarmupDecayLR decays linearly to warmup_min_lr at T and stays there).
Computed in float64 and returned as float32: the fp32 rounding of DeepSpeed's Python-float value.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .config_models import ZeroConfig

LrSchedule = Callable[[torch.Tensor], torch.Tensor]


def make_lr_schedule(cfg: ZeroConfig) -> LrSchedule:
    base = cfg.optimizer.params.lr
    if cfg.scheduler is None:
        return lambda applied: torch.full_like(applied, base, dtype=torch.float32)

    p = cfg.scheduler.params
    decay = cfg.scheduler.type == "WarmupDecayLR"
    warmup = max(2, p.warmup_num_steps)  # DeepSpeed clamps it so log(W) > 0
    inv_log = 1.0 / math.log(warmup)
    min_lr, delta = p.warmup_min_lr, p.warmup_max_lr - p.warmup_min_lr
    offset = p.last_batch_iteration
    first = min_lr if offset == -1 else base  # lr in the optimizer before the first scheduler.step()
    total = p.total_num_steps or 0
    decay_len = float(max(1, total - warmup))
    linear = p.warmup_type == "linear"

    def lr_at(applied: torch.Tensor) -> torch.Tensor:
        n = applied.to(torch.float64)
        it = (n + offset).clamp(min=0.0)  # iteration the scheduler is at when update n runs (n >= 1)
        ramp = it / warmup if linear else torch.log(it + 1.0) * inv_log
        after = ((total - it) / decay_len).clamp(min=0.0) if decay else torch.ones_like(it)
        gamma = torch.where(it < warmup, ramp, after)
        lr = torch.where(n < 0.5, torch.full_like(n, first), min_lr + delta * gamma)
        return lr.to(torch.float32)

    return lr_at

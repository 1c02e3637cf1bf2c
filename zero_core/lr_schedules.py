"""Learning-rate schedules, per optimizer group, with DeepSpeed's exact formulas.

DeepSpeed steps its scheduler after each *applied* update (never after a skipped fp16 step) and never at
initialisation, so the lr of an update is a function of the number of updates applied before it.

Device schedules (`make_lr_schedule`): WarmupLR, WarmupDecayLR and WarmupCosineLR are pure tensor
functions of `applied` (a float32 device tensor) returning one lr per group, so the hot loop never
syncs with the host. With last_batch_iteration = -1 (the default), update n >= 1 runs at iteration
it = n - 2 (clamped at 0) and the very first update uses what the scheduler wrote into the optimizer at
construction: WarmupLR/DecayLR warmup_min_lr, WarmupCosineLR 0 (it has "not started"). A resume value of
last_batch_iteration >= 0 starts at it = last_batch_iteration + n - 1 with the groups' own lr first.
  - WarmupLR (W = max(2, warmup_num_steps)): min + (max - min) * gamma, gamma = log(it + 1) / log(W)
    ("log") or it / W ("linear") while it < W, else 1; min/max are the config's, the same for every group
    (without warmup_max_lr: each group's own lr for WarmupLR, 1e-3 for WarmupDecayLR, DeepSpeed 0.19.8's defaults).
  - WarmupDecayLR: after warm-up gamma = max(0, (T - it) / max(1, T - W)), T = total_num_steps.
  - WarmupCosineLR: each group's own lr times a ratio: during warm-up min_ratio + (1 - min_ratio) * gamma,
    then max(0, cos_min + (1 - cos_min) * (1 + cos(pi * min(1, (it - W + 1) / max(1, T - W)))) / 2).
Computed in float64 and returned as float32: the fp32 rounding of DeepSpeed's Python-float value.

Host schedules (host_schedules.py): OneCycle (it also cycles beta1, beta2 then 0.99), LRRangeTest
(config_host_schedules.py), a torch LRScheduler, or a `lambda step: lr` are evaluated on the host, as DeepSpeed
evaluates them.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .config_models import ZeroConfig
from .config_optimizer_models import SchedulerConfig

LrSchedule = Callable[[torch.Tensor], torch.Tensor]
DEVICE_SCHEDULES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")


def make_lr_schedule(cfg: ZeroConfig, group_lrs: list[float] | None = None) -> LrSchedule:
    """applied -> lr per group (float32, shape [groups]); `group_lrs` are the groups' own lrs."""
    return lr_schedule_of(cfg.scheduler, group_lrs if group_lrs is not None else [cfg.optimizer.params.lr])


def lr_schedule_of(
    sched: SchedulerConfig | None, group_lrs: list[float], dtype: torch.dtype = torch.float32
) -> LrSchedule:
    """The same, from a scheduler section alone (a scheduler a script builds on its optimizer, too), in `dtype`
    (or the `out` dtype of a call: float64 gives the Python floats DeepSpeed reports)."""
    lrs = torch.tensor(group_lrs, dtype=torch.float64)
    on_device: dict[torch.device, tuple[torch.Tensor, ...]] = {}  # the constants below, copied to a device once

    def constants(device: torch.device) -> tuple[torch.Tensor | None, ...]:
        if device not in on_device:
            on_device[device] = tuple(None if t is None else t.to(device) for t in (lrs, first, delta))
        return on_device[device]

    if sched is None or sched.type not in DEVICE_SCHEDULES:  # constant (host schedules write lr themselves)
        first = delta = None
        return lambda applied, out=dtype: constants(applied.device)[0].to(out).expand(len(lrs)).clone()
    p = sched.params
    warmup = max(2, p.warmup_num_steps)  # DeepSpeed clamps it so log(W) > 0
    inv_log = 1.0 / math.log(warmup)
    linear = p.warmup_type == "linear"
    offset = p.last_batch_iteration
    total = p.total_num_steps or 0

    def gamma_ramp(it: torch.Tensor) -> torch.Tensor:
        return it / warmup if linear else torch.log(it + 1.0) * inv_log

    if sched.type == "WarmupCosineLR":
        decay_len = float(max(1, total - warmup))

        def factor(it: torch.Tensor, lr0: torch.Tensor, _: None) -> torch.Tensor:
            ramp = p.warmup_min_ratio + gamma_ramp(it) * (1.0 - p.warmup_min_ratio)
            progress = ((it - warmup + 1.0) / decay_len).clamp(max=1.0)
            cosine = (p.cos_min_ratio + (1.0 - p.cos_min_ratio) * (1.0 + torch.cos(math.pi * progress)) / 2).clamp(
                min=0.0
            )
            return lr0 * torch.where(it < warmup, ramp, cosine)

        first = torch.zeros_like(lrs)  # "not started": DeepSpeed writes 0 into every group
        delta = None  # a ratio of each group's own lr, no warm-up span
    else:
        decay = sched.type == "WarmupDecayLR"
        decay_len = float(max(1, total - warmup))
        # without warmup_max_lr, WarmupLR warms up to each group's own lr and WarmupDecayLR to 1e-3 (DeepSpeed's
        # defaults); delta in float64 before the ramp, as DeepSpeed's Python floats
        top = p.warmup_max_lr if p.warmup_max_lr is not None else (1e-3 if decay else None)
        min_lr = p.warmup_min_lr
        delta = (lrs if top is None else torch.full_like(lrs, top)) - min_lr

        def factor(it: torch.Tensor, lr0: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
            after = ((total - it) / decay_len).clamp(min=0.0) if decay else torch.ones_like(it)
            return min_lr + delta * torch.where(it < warmup, gamma_ramp(it), after)

        first = torch.full_like(lrs, min_lr)
    if offset != -1:
        first = lrs.clone()  # a resumed scheduler writes nothing at construction: the groups' own lr

    def lr_at(applied: torch.Tensor, out: torch.dtype = dtype) -> torch.Tensor:
        n = applied.to(torch.float64).reshape(1)
        it = (n + offset).clamp(min=0.0)  # iteration the scheduler is at when update n runs (n >= 1)
        lr0, first_lrs, delta_lrs = constants(n.device)
        return torch.where(n < 0.5, first_lrs, factor(it, lr0, delta_lrs)).to(out)

    return lr_at

"""The optimizer side of the torch-native variants (ddp, fsdp2), configured from the DeepSpeed dict.

Same hyper-parameters, schedule (zero_core's DeepSpeed-exact lr function), clipping rule and
accumulation counting as zero_core, built from torch.optim.AdamW: with the same data and seed the
loss curves match zero_core's to rounding.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from zero_core import load_config
from zero_core.lr_schedules import make_lr_schedule


class TorchOptim:
    def __init__(self, params: Iterable[torch.nn.Parameter], ds: dict[str, Any], world_size: int,
                 device: torch.device) -> None:
        cfg = load_config(ds, world_size)
        p = cfg.optimizer.params
        self.params = [q for q in params if q.requires_grad]
        cls = torch.optim.AdamW if cfg.optimizer.decoupled else torch.optim.Adam
        self.opt = cls(self.params, lr=p.lr, betas=tuple(p.betas), eps=p.eps, weight_decay=p.weight_decay)
        self.lr_at = make_lr_schedule(cfg)
        self.clip = float(cfg.gradient_clipping or 0.0)
        self.gas = cfg.gradient_accumulation_steps
        self.dtype = cfg.dtype
        self.scaler = torch.amp.GradScaler(device.type) if cfg.fp16.enabled else None
        self.applied = 0  # updates applied (an fp16 overflow skips one and does not advance the schedule)
        self.micro = 0

    def is_boundary(self) -> bool:
        return (self.micro + 1) % self.gas == 0

    def backward(self, loss: torch.Tensor) -> None:
        loss = loss / self.gas
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self) -> None:
        if self.is_boundary():
            if self.scaler:
                self.scaler.unscale_(self.opt)
            if self.clip > 0:
                torch.nn.utils.clip_grad_norm_(self.params, self.clip)
            lr = float(self.lr_at(torch.tensor(float(self.applied))))
            for group in self.opt.param_groups:
                group["lr"] = lr
            if self.scaler:
                before = self.scaler.get_scale()
                self.scaler.step(self.opt)
                self.scaler.update()
                skipped = self.scaler.get_scale() < before
            else:
                self.opt.step()
                skipped = False
            self.applied += 0 if skipped else 1
            self.opt.zero_grad(set_to_none=True)
        self.micro += 1

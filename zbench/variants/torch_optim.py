"""The optimizer side of the torch-native variants (ddp, fsdp2), configured from the DeepSpeed dict.

Same hyper-parameters, schedule (zero_core's DeepSpeed-exact lr function), clipping rule and
accumulation counting as zero_core, built from torch.optim.AdamW: with the same data and seed the
loss curves match zero_core's to rounding. Under fp16 the loss scale follows the dict's `fp16` keys with
zero_core's `LossScaler` (DeepSpeed's dynamic scaler step for step), not torch's GradScaler: a reference
that skipped other steps than the engine under test would make every fp16 parity comparison fail.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist

from zero_core import load_config
from zero_core.loss_scaler import LossScaler
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
        self.scaler = LossScaler(cfg, device) if cfg.fp16.enabled else None
        self.applied = 0  # updates applied (an fp16 overflow skips one and does not advance the schedule)
        self.skipped = 0
        self.micro = 0
        self.lr = float(self.lr_at(torch.tensor(0.0))[0])
        self.grad_norm = torch.zeros((), device=device)

    def is_boundary(self) -> bool:
        return (self.micro + 1) % self.gas == 0

    def backward(self, loss: torch.Tensor) -> None:
        loss = loss / self.gas
        (loss * self.scaler.scale.squeeze() if self.scaler else loss).backward()

    def step(self) -> None:
        if self.is_boundary():
            grads = [q.grad for q in self.params if q.grad is not None]
            if self.scaler:
                torch._foreach_mul_(grads, self.scaler.inv_scale.squeeze())
            # the norm before clipping (HF's and DeepSpeed's grad_norm); inf disables clipping but still measures
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip if self.clip > 0 else float("inf"))
            self.grad_norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            overflow = False
            if self.scaler:
                flag = (~torch.isfinite(self.grad_norm)).to(torch.float32).reshape(1)
                if dist.is_initialized() and dist.get_world_size() > 1:
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # sharded gradients (FSDP2): any rank's overflow
                self.scaler.update(flag)
                overflow = bool(flag.item())  # the reference may sync: it decides on the host whether to step
            self.lr = float(self.lr_at(torch.tensor(float(self.applied)))[0])
            for group in self.opt.param_groups:
                group["lr"] = self.lr
            if not overflow:
                self.opt.step()
            self.applied += 0 if overflow else 1
            self.skipped += 1 if overflow else 0
            self.opt.zero_grad(set_to_none=True)
        self.micro += 1

    def stats(self) -> dict[str, Any]:
        """The last optimizer step's numbers for live logging (tensors stay on the device until read)."""
        return {"learning_rate": self.lr, "grad_norm": self.grad_norm.detach().clone(),
                "loss_scale": self.scaler.scale.clone() if self.scaler else 1.0, "skipped_steps": self.skipped}

"""Loss scaling with all state in device tensors, so the hot loop never syncs with the host.

Dynamic mode mirrors DeepSpeed's `DynamicLossScaler.update_scale` (deepspeed/runtime/fp16/loss_scaler.py)
step for step, with scale_factor 2 and the config's fp16 keys:
- state: cur_scale = 2**initial_scale_power, cur_iter = 0, last_overflow_iter = -1, cur_hysteresis = hysteresis.
- overflow: if hysteresis == 1 or cur_hysteresis == 1 the scale halves, floored at min_loss_scale, and
  cur_hysteresis is NOT refilled; otherwise only cur_hysteresis -= 1. Either way last_overflow_iter = cur_iter.
- no overflow: with consecutive_hysteresis, cur_hysteresis is refilled first. Then, if
  cur_iter - last_overflow_iter - 1 is positive and a multiple of loss_scale_window, the scale doubles (no
  upper bound) and, without consecutive_hysteresis, cur_hysteresis is refilled. (DeepSpeed 0.19.8; releases
  before its `stable_interval` grew one step earlier.)
- cur_iter += 1 on every call.
DeepSpeed calls it once per optimizer step (at the accumulation boundary), overflow or not.
One difference: when an overflow would push the scale below min_loss_scale, newer DeepSpeed raises
(raise_error_at_min_scale) while older versions keep going at the minimum. Raising needs a host sync,
so the scale stays at the minimum and `min_scale_overflows` counts these events for the engine to
report when it next reads the device anyway.

Static mode (fp16 with loss_scale > 0) keeps that scale; bf16 and fp32 use 1.0 (DeepSpeed's
CreateLossScaler). `update` is a no-op for both.
"""

from __future__ import annotations

from typing import Any

import torch

from .config_models import ZeroConfig

_FACTOR = 2.0  # DeepSpeed's scale_factor; not configurable from its JSON either


class LossScaler:
    def __init__(self, cfg: ZeroConfig, device: torch.device) -> None:
        fp16 = cfg.fp16
        self.dynamic = cfg.dynamic_loss_scale
        self.window = fp16.loss_scale_window
        self.hysteresis = fp16.hysteresis
        self.consecutive_hysteresis = fp16.consecutive_hysteresis
        if self.dynamic:
            init = 2.0 ** fp16.initial_scale_power
        else:
            init = fp16.loss_scale if fp16.enabled and fp16.loss_scale > 0 else 1.0
        self.init_scale = init

        def f32(v: float) -> torch.Tensor:
            return torch.full((1,), v, dtype=torch.float32, device=device)

        def i64(v: int) -> torch.Tensor:
            return torch.full((1,), v, dtype=torch.int64, device=device)

        self.scale = f32(init)
        self.inv_scale = f32(1.0 / init)
        self.min_scale = f32(fp16.min_loss_scale)
        self.cur_iter = i64(0)
        self.last_overflow_iter = i64(-1)
        self.cur_hysteresis = i64(self.hysteresis)
        self.min_scale_overflows = i64(0)

    def update(self, overflow: torch.Tensor) -> None:
        """Advance by one optimizer step; `overflow` is a 1-element int/bool device tensor."""
        if not self.dynamic:
            return
        over = overflow.reshape(1).bool()
        scale, hyst = self.scale, self.cur_hysteresis
        shift = hyst == 1 if self.hysteresis != 1 else torch.ones_like(over)
        # overflow branch
        scale_over = torch.where(shift, torch.maximum(scale / _FACTOR, self.min_scale), scale)
        hyst_over = torch.where(shift, hyst, hyst - 1)
        # good-step branch
        hyst_good = torch.full_like(hyst, self.hysteresis) if self.consecutive_hysteresis else hyst
        stable = self.cur_iter - self.last_overflow_iter - 1  # good steps since the last overflow, before this one
        grow = (stable > 0) & (torch.remainder(stable, self.window) == 0)
        scale_good = torch.where(grow, scale * _FACTOR, scale)
        if not self.consecutive_hysteresis:
            hyst_good = torch.where(grow, torch.full_like(hyst, self.hysteresis), hyst_good)

        self.min_scale_overflows += (over & shift & (scale == self.min_scale)).long()
        self.last_overflow_iter.copy_(torch.where(over, self.cur_iter, self.last_overflow_iter))
        self.cur_hysteresis.copy_(torch.where(over, hyst_over, hyst_good))
        self.scale.copy_(torch.where(over, scale_over, scale_good))
        self.inv_scale.copy_(1.0 / self.scale)
        self.cur_iter += 1

    # Names follow DeepSpeed's attributes so checkpoint converters can map them one to one.
    def state_dict(self) -> dict[str, torch.Tensor | float | int]:
        return {
            "dynamic": int(self.dynamic),
            "cur_scale": self.scale.clone(),
            "cur_iter": self.cur_iter.clone(),
            "last_overflow_iter": self.last_overflow_iter.clone(),
            "cur_hysteresis": self.cur_hysteresis.clone(),
            "min_scale_overflows": self.min_scale_overflows.clone(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Copies in place: other components hold references to `scale` and `inv_scale`."""
        for key, dst in (("cur_scale", self.scale), ("cur_iter", self.cur_iter),
                         ("last_overflow_iter", self.last_overflow_iter), ("cur_hysteresis", self.cur_hysteresis),
                         ("min_scale_overflows", self.min_scale_overflows)):
            if key in sd:
                dst.copy_(torch.as_tensor(sd[key], dtype=dst.dtype).reshape(1))
        self.inv_scale.copy_(1.0 / self.scale)


class ReportsLossScale:
    """`loss_scale` / `cur_scale` as DeepSpeed's ZeRO optimizers answer them, for scripts that read
    `engine.optimizer.loss_scale` or the optimizer `initialize` returned; `scaler` is set by the engine."""

    scaler: LossScaler | None = None

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 unless fp16; a host sync)."""
        return float(self.scaler.scale) if self.scaler is not None else 1.0

    cur_scale = loss_scale  # DeepSpeed's other name for it

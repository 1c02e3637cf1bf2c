"""zero_core at stage 0-3, configured by the variant's DeepSpeed dict."""

from __future__ import annotations

from typing import Any

import torch

import zero_core

from ..models.factory import ModelBundle
from .base import EngineObjectVariant


class ZeroVariant(EngineObjectVariant):
    engine = "zero"

    def __init__(self, bundle: ModelBundle, ds: dict[str, Any], device: torch.device) -> None:
        super().__init__(bundle, ds, device)
        self.engine_obj = zero_core.initialize(bundle.model, ds)

    def step_stats(self) -> dict[str, Any]:
        """Device tensors of zero_core's optimizer and scaler, copied without a host sync."""
        e = self.engine_obj
        if e.host_schedule is not None:  # OneCycle or a torch scheduler: computed on the host anyway
            return super().step_stats()
        opt = e.optimizer
        return {"learning_rate": opt.lr[0].clone(), "grad_norm": opt.grad_norm[0].clone(),
                "loss_scale": e.scaler.scale[0].clone(), "skipped_steps": opt.skipped.clone()}

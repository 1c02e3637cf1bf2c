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
        self.engine_obj = zero_core.initialize(bundle.model, with_overlapped_weight_gather(ds))

    def step_stats(self) -> dict[str, Any]:
        """Device tensors of zero_core's optimizer and scaler, copied without a host sync."""
        e = self.engine_obj
        if e.host_schedule is not None:  # OneCycle or a torch scheduler: computed on the host anyway
            return super().step_stats()
        opt = e.optimizer
        return {"learning_rate": opt.lr[0].clone(), "grad_norm": opt.grad_norm[0].clone(),
                "loss_scale": e.scaler.scale[0].clone(), "skipped_steps": opt.skipped.clone()}


def with_overlapped_weight_gather(ds: dict[str, Any]) -> dict[str, Any]:
    """The config with zero_core.overlap_weight_gather on unless it says otherwise: the weight gathers (and an
    offloaded host update) run on after step(), which is safe here since zbench's loop reads the weights only
    through the next forward (which waits per module) or after wait_for_weights()."""
    own = ds.get("zero_core")
    if own is not None and not isinstance(own, dict):
        return ds  # the config check names the problem
    return {**ds, "zero_core": {"overlap_weight_gather": True, **(own or {})}}

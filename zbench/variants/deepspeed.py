"""DeepSpeed itself (only where it is installed), given the same DeepSpeed dict as zero_core."""

from __future__ import annotations

from typing import Any

import torch

from ..models.factory import ModelBundle
from .base import EngineObjectVariant


class DeepSpeedVariant(EngineObjectVariant):
    engine = "deepspeed"

    def __init__(self, bundle: ModelBundle, ds: dict[str, Any], device: torch.device) -> None:
        super().__init__(bundle, ds, device)
        import deepspeed

        deepspeed.init_distributed()  # reuses the process group the worker created
        params = [p for p in bundle.model.parameters() if p.requires_grad]
        self.engine_obj, _, _, _ = deepspeed.initialize(model=bundle.model, model_parameters=params, config=ds)

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

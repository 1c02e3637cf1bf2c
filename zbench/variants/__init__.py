"""One module per engine behind one interface (`base.Variant`): ddp, zero, fsdp2, deepspeed."""

from __future__ import annotations

from typing import Any

import torch

from ..models.factory import ModelBundle
from .base import Variant


def build_variant(engine: str, bundle: ModelBundle, ds: dict[str, Any], device: torch.device) -> Variant:
    """Wrap `bundle.model` with `engine` (imported lazily: deepspeed only when asked for)."""
    if engine == "ddp":
        from .ddp import DDPVariant as cls
    elif engine == "zero":
        from .zero import ZeroVariant as cls
    elif engine == "fsdp2":
        from .fsdp2 import FSDP2Variant as cls
    elif engine == "deepspeed":
        from .deepspeed import DeepSpeedVariant as cls
    else:
        raise ValueError(f"unknown engine {engine!r}")
    return cls(bundle, ds, device)


__all__ = ["Variant", "build_variant"]


"""ZeroStrategy's precision: the Trainer's `precision=` decides the engine's fp16/bf16 section where the config has
none (as Lightning's DeepSpeedStrategy writes it), a config section that says otherwise is refused, and the
batches are cast to the training dtype (as Lightning's DeepSpeedPrecision casts them) so the engine's 16-bit
weights meet 16-bit inputs."""

from __future__ import annotations

from typing import Any, Callable

import torch
from lightning.pytorch.plugins.precision import Precision
from lightning_utilities import apply_to_collection

# Trainer(precision=...) -> the mode the engine trains in
MODES = {"32-true": "fp32", "32": "fp32", "16-mixed": "fp16", "16-true": "fp16", "bf16-mixed": "bf16",
         "bf16-true": "bf16"}
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _enabled(section: Any) -> Any:
    """A config's fp16/bf16 section's `enabled` (DeepSpeed's default: off); "auto" stays "auto"."""
    return section.get("enabled", False) if isinstance(section, dict) else section


def format_precision(config: dict[str, Any], flag: str, fp16_values: dict[str, Any]) -> None:
    """Write the fp16/bf16 section the Trainer's precision asks for where the config has none; refuse a config
    whose sections turn on another mode (Lightning's DeepSpeedStrategy then fails inside DeepSpeed)."""
    mode = MODES[flag]
    if "bf16" not in config and "bfloat16" in config:  # DeepSpeed's legacy name
        config["bf16"] = config.pop("bfloat16")
    on = [name for name in ("fp16", "bf16") if _enabled(config.get(name)) is True]
    turned_off = _enabled(config.get(mode)) is False and mode in config
    if [name for name in on if name != mode] or turned_off:
        raise ValueError(
            f"Trainer(precision={flag!r}) trains in {mode} but the config's fp16/bf16 sections train in "
            f"{'+'.join(on) or 'fp32'}; make them agree (drop the config's fp16/bf16 sections to follow the Trainer)"
        )
    if mode == "fp16" and "fp16" not in config:
        config["fp16"] = {"enabled": True, **fp16_values}
    elif mode == "bf16" and "bf16" not in config:
        config["bf16"] = {"enabled": True}


class ZeroPrecision(Precision):
    """The engine does the backward, the loss scaling, clipping and the update; batches come in its dtype."""

    def __init__(self, precision: str, strategy: Any) -> None:
        self.precision, self.strategy = precision, strategy  # type: ignore[assignment]
        self.dtype = _DTYPES[MODES[precision]]

    def convert_input(self, data: Any) -> Any:
        """Float tensors of the batch in the training dtype; other tensors and values as they are."""
        return apply_to_collection(data, torch.Tensor, _cast_float, self.dtype)

    def backward(self, tensor: torch.Tensor, model: Any, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        # Lightning already divided the loss by accumulate_grad_batches
        self.strategy.engine.backward(tensor, scale_wrt_gas=False)

    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        if closure() is None and model.automatic_optimization:
            raise ValueError(
                "training_step returned None (a skipped backward), which ZeroStrategy cannot skip in "
                "step with the other ranks; return the loss"
            )
        self.strategy.engine.step()

    def clip_gradients(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine clips at its step (the config's gradient_clipping, else Trainer(gradient_clip_val))."""



def _cast_float(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype) if torch.is_floating_point(tensor) else tensor  # token ids and masks stay integers

"""`deepspeed.checkpoint`: of DeepSpeed's checkpoint tools, the one training scripts and Accelerate call
(`utils.clone_tensors_for_torch_save`). Its converters (DeepSpeedCheckpoint, ds_to_universal) are zbench's
`zbench inspect` and `zbench convert`, which read DeepSpeed's checkpoints as they are."""

from __future__ import annotations

from typing import Any

from . import utils  # noqa: F401


def __getattr__(name: str) -> Any:
    raise AttributeError(f"deepspeed.checkpoint.{name} is not provided by zero_core; inspect or convert DeepSpeed "
                         "checkpoints with `zbench inspect DIR` and `zbench convert DIR --to fp32`")

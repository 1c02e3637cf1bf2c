"""`deepspeed.checkpoint`: of DeepSpeed's checkpoint tools, the ones training scripts and Accelerate call
(`utils.clone_tensors_for_torch_save`, the file and key names of `constants`). Its converters (DeepSpeedCheckpoint,
ds_to_universal) are zbench's `zbench inspect` and `zbench convert`, which read DeepSpeed's checkpoints as they are."""

from __future__ import annotations

from ..refused import refusing_getattr
from . import constants, utils  # noqa: F401

CONVERTERS = "inspect or convert DeepSpeed checkpoints with `zbench inspect DIR` and `zbench convert DIR --to fp32`"
__getattr__ = refusing_getattr(__name__, {"DeepSpeedCheckpoint": CONVERTERS})

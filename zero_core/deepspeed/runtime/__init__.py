"""`deepspeed.runtime`: the helpers scripts import from it (`utils.see_memory_usage`, `dataloader.RepeatingLoader` and
`DeepSpeedDataLoader`, `activation_checkpointing.checkpointing`, the schedulers of `lr_schedules`,
`engine.DeepSpeedEngine`, `zero`'s `Init`, `GatheredParameters` and memory estimators)."""

from . import activation_checkpointing, dataloader, engine, lr_schedules, utils, zero

__all__ = ["activation_checkpointing", "dataloader", "engine", "lr_schedules", "utils", "zero"]

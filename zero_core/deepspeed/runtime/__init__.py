"""`deepspeed.runtime`: the helpers scripts import from it (`utils.see_memory_usage`,
`dataloader.RepeatingLoader`, the schedulers of `lr_schedules`, `engine.DeepSpeedEngine`, `zero`'s `Init`,
`GatheredParameters` and memory estimators)."""

from . import dataloader, engine, lr_schedules, utils, zero

__all__ = ["dataloader", "engine", "lr_schedules", "utils", "zero"]

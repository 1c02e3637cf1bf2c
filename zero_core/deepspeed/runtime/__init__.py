"""`deepspeed.runtime`: the helpers scripts import from it (`utils.see_memory_usage`,
`dataloader.RepeatingLoader`, the schedulers of `lr_schedules`, `engine.DeepSpeedEngine`)."""

from . import dataloader, engine, lr_schedules, utils

__all__ = ["dataloader", "engine", "lr_schedules", "utils"]

"""`deepspeed.runtime`: the helpers scripts import from it (`utils.see_memory_usage`,
`dataloader.RepeatingLoader`, the schedulers of `lr_schedules`)."""

from . import dataloader, lr_schedules, utils

__all__ = ["dataloader", "lr_schedules", "utils"]

"""`deepspeed.runtime`: the helpers scripts import from it (`utils.see_memory_usage`,
`dataloader.RepeatingLoader`)."""

from . import dataloader, utils

__all__ = ["dataloader", "utils"]

"""`deepspeed.runtime`: the helpers scripts import from it (`utils.see_memory_usage`, `utils.clip_grad_norm_`, ...,
`dataloader.RepeatingLoader` and `DeepSpeedDataLoader`, `activation_checkpointing.checkpointing`, the schedulers of
`lr_schedules`, `engine.DeepSpeedEngine`, `config.DeepSpeedConfig`, `zero`'s `Init`, `GatheredParameters` and memory
estimators)."""

from . import activation_checkpointing, config, dataloader, engine, lr_schedules, utils, zero

__all__ = ["activation_checkpointing", "config", "dataloader", "engine", "lr_schedules", "utils", "zero"]

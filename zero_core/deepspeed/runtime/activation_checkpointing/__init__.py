"""`deepspeed.runtime.activation_checkpointing`: where DeepSpeed keeps `deepspeed.checkpointing`."""

from . import checkpointing

__all__ = ["checkpointing"]

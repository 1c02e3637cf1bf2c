"""`deepspeed.runtime.activation_checkpointing.checkpointing`: the module `deepspeed.checkpointing` names, under
the path DeepSpeed defines it at (scripts import either)."""

from ...checkpointing import checkpoint, configure, is_configured

__all__ = ["checkpoint", "configure", "is_configured"]

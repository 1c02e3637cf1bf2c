"""`deepspeed.checkpointing`: activation checkpointing through torch.utils.checkpoint (recompute in backward)."""

from __future__ import annotations

from typing import Any, Callable

import torch.utils.checkpoint

__all__ = ["checkpoint", "configure", "is_configured"]
_configured = False


def checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    """Run `function(*args)` without keeping its activations; they are recomputed in backward."""
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)


def configure(
    mpu_: Any = None,
    deepspeed_config: Any = None,
    partition_activations: bool | None = None,
    contiguous_checkpointing: bool | None = None,
    num_checkpoints: int | None = None,
    checkpoint_in_cpu: bool | None = None,
    synchronize: bool | None = None,
    profile: bool | None = None,
) -> None:
    """Accepts DeepSpeed's options. Partitioning activations over a model-parallel group changes nothing without
    model parallelism (one rank); keeping them on the CPU (`checkpoint_in_cpu`) is refused by name."""
    global _configured
    if checkpoint_in_cpu:
        raise NotImplementedError(
            "deepspeed.checkpointing.configure(checkpoint_in_cpu=True) is not supported by zero_core; activations "
            "are recomputed, not offloaded: drop checkpoint_in_cpu"
        )
    _configured = True


def is_configured() -> bool:
    return _configured

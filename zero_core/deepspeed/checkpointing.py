"""`deepspeed.checkpointing`: activation checkpointing through torch.utils.checkpoint (recompute in backward)."""

from __future__ import annotations

from typing import Any, Callable

import torch.utils.checkpoint

__all__ = ["checkpoint", "non_reentrant_checkpoint", "configure", "is_configured", "reset", "set_num_layers",
           "partition_activations_in_checkpoint"]
_configured = False


def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run `function(*args, **kwargs)` without keeping its activations; they are recomputed in backward. Keyword
    arguments go to `function` (tensors among them get their gradients), none to torch's checkpoint."""
    if kwargs:
        def function_with_kwargs(*positional: Any, _run: Callable[..., Any] = function) -> Any:
            return _run(*positional, **kwargs)

        return torch.utils.checkpoint.checkpoint(function_with_kwargs, *args, use_reentrant=False)
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)


def non_reentrant_checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    """DeepSpeed's non-reentrant variant: the same recomputation as `checkpoint`, which is non-reentrant here."""
    return checkpoint(function, *args)


def reset() -> None:
    """DeepSpeed frees its contiguous activation buffers here; recomputation through torch keeps none."""


def set_num_layers(nlayers: int) -> None:
    """The layer count DeepSpeed sizes its contiguous buffers by; nothing is sized by it here."""


def partition_activations_in_checkpoint(partition_activation: bool) -> None:
    """Taken and unused, as `configure(partition_activations=...)`: one rank holds each activation anyway."""


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

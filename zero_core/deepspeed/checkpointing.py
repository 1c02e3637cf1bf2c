"""`deepspeed.checkpointing`: activation checkpointing through torch.utils.checkpoint (recompute in backward).

With `configure(checkpoint_in_cpu=True)` (or the config's `activation_checkpointing.cpu_checkpointing` given as
`configure(deepspeed_config=...)`), as DeepSpeed's: what a checkpoint keeps from forward to backward, its
floating-point tensor arguments, is kept as host copies, brought back to their device for the recomputation."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.utils.checkpoint

from ..config_file import config_data
from .refused import refusing_getattr

__all__ = ["checkpoint", "non_reentrant_checkpoint", "configure", "is_configured", "reset", "set_num_layers",
           "partition_activations_in_checkpoint"]
_configured = False
_cpu_checkpoint = False


def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run `function(*args, **kwargs)` without keeping its activations; they are recomputed in backward. Keyword
    arguments go to `function` (tensors among them get their gradients), none to torch's checkpoint."""
    if _cpu_checkpoint and torch.is_grad_enabled():
        if kwargs:  # as DeepSpeed's: tensors passed by keyword are kept on the host too
            keys, count = tuple(kwargs), len(args)

            def by_keyword(*given: Any, _run: Callable[..., Any] = function) -> Any:
                return _run(*given[:count], **dict(zip(keys, given[count:])))

            return _checkpoint_on_host(by_keyword, (*args, *kwargs.values()))
        return _checkpoint_on_host(function, args)
    if kwargs:
        def function_with_kwargs(*positional: Any, _run: Callable[..., Any] = function) -> Any:
            return _run(*positional, **kwargs)

        return torch.utils.checkpoint.checkpoint(function_with_kwargs, *args, use_reentrant=False)
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """The host copy a checkpoint keeps until backward (on the CPU, the tensor's own memory)."""
    return tensor.detach().to("cpu")


def _checkpoint_on_host(function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """torch's checkpoint of `function(*args)` holding host copies of the floating-point tensors among `args`: the
    forward runs on the tensors given, the recomputation on the copies brought back to each one's device (with its
    requires_grad, so the recomputed graph saves what the forward's did). Gradients reach `args` through the
    forward's graph, so they are those of a checkpoint that keeps `args` themselves."""
    kept = [isinstance(a, torch.Tensor) and a.is_floating_point() for a in args]
    places = [(a.device, a.requires_grad) if k else None for a, k in zip(args, kept)]
    first = [args]  # the forward's own tensors, dropped once it has run
    on_host = [_to_host(a) if k else a for a, k in zip(args, kept)]
    # torch keeps and replays the RNG state of the devices of its tensor arguments: one empty tensor per device
    anchors = list({p[0]: torch.empty(0, device=p[0]) for p in places if p and p[0].type != "cpu"}.values())

    def run(*held: Any) -> Any:
        if first:
            return function(*first.pop())
        back = [h.to(p[0]).requires_grad_(p[1]) if p else h for h, p in zip(held, places)]
        return function(*back)

    return torch.utils.checkpoint.checkpoint(run, *on_host, *anchors, use_reentrant=False)


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
    """Accepts DeepSpeed's options, as DeepSpeed's: each call starts from the defaults, then takes `deepspeed_config`
    (a config dict or the path of one), then the arguments given. Partitioning activations over a model-parallel
    group changes nothing without model parallelism (one rank); `checkpoint_in_cpu` (the config's
    `cpu_checkpointing`) keeps each checkpoint's tensor arguments on the host until backward."""
    global _configured, _cpu_checkpoint
    on_host = _config_cpu_checkpointing(deepspeed_config) if deepspeed_config is not None else False
    if checkpoint_in_cpu is not None:
        on_host = checkpoint_in_cpu
    if not isinstance(on_host, bool):
        raise ValueError(f"checkpoint_in_cpu must be True or False, got {on_host!r}; pass a bool")
    _cpu_checkpoint = on_host
    _configured = True


def _config_cpu_checkpointing(config: Any) -> bool:
    """The config's `activation_checkpointing.cpu_checkpointing` (a dict or the path of one); False if unset."""
    data = config_data(config)
    if not isinstance(data, dict):
        raise ValueError(f"deepspeed_config must be a config dict or the path of one, got {type(data).__name__}; "
                         "pass the dict or path given to deepspeed.initialize")
    section = data.get("activation_checkpointing", {})
    value = section.get("cpu_checkpointing", False) if isinstance(section, dict) else None
    if not isinstance(value, bool):
        raise ValueError("the config's activation_checkpointing.cpu_checkpointing must be true or false (in an "
                         "activation_checkpointing section); set it so")
    return value


def is_configured() -> bool:
    return _configured


_MODEL_PARALLEL_RNG = ("it keeps the random states of tensor-parallel regions, and zero_core has no model "
                       "parallelism; seed with torch.manual_seed (every rank holds whole layers)")
__getattr__ = refusing_getattr(__name__, dict.fromkeys(
    ("get_cuda_rng_tracker", "model_parallel_cuda_manual_seed", "model_parallel_reconfigure_tp_seed",
     "CudaRNGStatesTracker"), _MODEL_PARALLEL_RNG))

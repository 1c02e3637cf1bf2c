"""zero_core: ZeRO stage 0-3 sharded data-parallel training behind a DeepSpeed-style API."""

from __future__ import annotations

import os

import torch

from .comm import CollectiveError, CollectiveTimeout
from .config import ConfigError, ZeroConfig, load_config
from .engine import Engine
from .overflow_log import NonFiniteError

__all__ = ["initialize", "Engine", "ZeroConfig", "ConfigError", "load_config", "CollectiveError", "CollectiveTimeout",
           "NonFiniteError"]


def initialize(model: torch.nn.Module, config: dict | str | os.PathLike | ZeroConfig) -> Engine:
    """Wrap `model` for ZeRO training.

    `config` is a DeepSpeed-style dict, a path to such a JSON file, or a `ZeroConfig`. The default
    process group is used (created from torchrun's environment if absent: nccl on CUDA, gloo on CPU);
    without one, the engine runs as a world of one.
    """
    return Engine(model, config)

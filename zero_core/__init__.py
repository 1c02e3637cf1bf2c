"""zero_core: ZeRO stage 0-3 sharded data-parallel training behind a DeepSpeed-style API."""

from __future__ import annotations

import os
from typing import Any

import torch

from .comm import CollectiveError, CollectiveTimeout
from .config import ConfigError, ZeroConfig, load_config
from .config_errors import UnsupportedFeature
from .config_auto import AutoValues, fill_auto
from .deferred import init_context
from .engine import Engine
from .overflow_log import NonFiniteError
from .pretrained import load_pretrained
from .refusal_hook import install as _install_refusal_hook

_install_refusal_hook()  # an uncaught refusal of the user's input is its one line, not a traceback

__all__ = [
    "initialize",
    "init_context",
    "load_pretrained",
    "Engine",
    "ZeroConfig",
    "ConfigError",
    "UnsupportedFeature",
    "load_config",
    "AutoValues",
    "fill_auto",
    "CollectiveError",
    "CollectiveTimeout",
    "NonFiniteError",
]


def initialize(
    model: torch.nn.Module,
    config: dict | str | os.PathLike | ZeroConfig,
    model_parameters: Any = None,
    optimizer: Any = None,
    lr_scheduler: Any = None,
    *,
    auto: AutoValues | dict | None = None,
    pretrained: str | os.PathLike | None = None,
) -> Engine:
    """Wrap `model` for ZeRO training.

    `config` is a DeepSpeed-style dict, a path to such a JSON file, or a `ZeroConfig`. `model_parameters`
    takes torch-style parameter groups (per-group lr, weight_decay, betas, eps); `optimizer` a torch
    optimizer (AdamW/Adam run on the fused kernels with its groups; others as they are) or a callable
    building one; `lr_scheduler` a torch scheduler, a callable building one on the optimizer, or
    `lambda step: lr`. The default process group is used (created from torchrun's environment if absent:
    nccl on CUDA, gloo on CPU); without one, the engine runs as a world of one. `auto` fills the config's
    "auto" values as Hugging Face's Trainer does (an AutoValues or a dict of its fields, e.g.
    {"learning_rate": 3e-5, "bf16": True}; see zero_core/config_auto.py). `pretrained` names a Hugging Face
    safetensors folder whose weights replace the initial ones, each rank reading only its shards
    (`load_pretrained`). A model built inside `init_context` (or on the meta device) is never whole on a rank.
    """
    engine = Engine(
        model, config, model_parameters=model_parameters, optimizer=optimizer, lr_scheduler=lr_scheduler, auto=auto
    )
    if pretrained is not None:
        load_pretrained(engine, pretrained)
    return engine

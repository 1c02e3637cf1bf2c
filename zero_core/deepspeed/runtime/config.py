"""`deepspeed.runtime.config.DeepSpeedConfig(config, mpu=None)` (also `deepspeed.DeepSpeedConfig`): a config dict
or file read by zero_core's parser (validated, "auto"-free, batch sizes resolved for the data-parallel world size
as DeepSpeed resolves them) and answered, read-only, through the attributes scripts read most: the same names
`engine._config` answers (`train_batch_size`, `train_micro_batch_size_per_gpu`, `gradient_accumulation_steps`,
`zero_config` (`.stage`, ...), `zero_optimization_stage`, `zero_enabled`, `float16_config`, `bfloat16_config`,
`fp16_enabled`, `bfloat16_enabled`, `gradient_clipping`, `optimizer_name`, `optimizer_params`, `scheduler_name`,
`scheduler_params`, `world_size`, `global_rank`, `_param_dict`, ...; zero_core/engine_ds_config.py) plus
`timers_config`. What zero_core's parser refuses is refused here in one line, as at `initialize`."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import torch.distributed as dist

from ...config import resolve_config
from ...engine_config_getters import ConfigGetters
from ...engine_ds_config import READERS, DeepSpeedConfigView
from ...engine_monitor import read_monitor_config
from ...engine_queries import given_dict, with_items
from ..staged_offload import unread_offload_dropped


class _ParsedConfig(ConfigGetters):
    """What the view's readers ask an engine for, without an engine: the validated config, the world, the getters."""

    def __init__(self, config: Any, world_size: int, rank: int) -> None:
        self.config, self.world_size, self.rank = config, world_size, rank
        self.monitor = SimpleNamespace(config=read_monitor_config(config))


def _world(mpu: Any) -> tuple[int, int]:
    """(data-parallel world size, global rank): the process group's, the mpu's data-parallel size if given, a world
    of one without a process group (as DeepSpeed's config falls back to)."""
    if not dist.is_initialized():
        return 1, 0
    size = mpu.get_data_parallel_world_size() if mpu is not None else dist.get_world_size()
    return int(size), dist.get_rank()


def _timers(raw: Any) -> SimpleNamespace:
    """DeepSpeed's `timers.throughput` section (enabled and synchronized, both True unless set)."""
    section = raw.get("timers", {}) if isinstance(raw, dict) else {}
    throughput = section.get("throughput", {}) if isinstance(section, dict) else {}
    return SimpleNamespace(enabled=bool(throughput.get("enabled", True)),
                           synchronized=bool(throughput.get("synchronized", True)))


class DeepSpeedConfig(DeepSpeedConfigView):
    """DeepSpeed's parsed config, read-only (see the module's docstring)."""

    __slots__ = ("_extra",)

    def __init__(self, config: Any, mpu: Any = None, mesh_device: Any = None) -> None:
        if mesh_device is not None:
            raise NotImplementedError("DeepSpeedConfig(mesh_device=...) (model parallelism) is not supported by "
                                      "zero_core; it trains data-parallel with ZeRO sharding only")
        if not isinstance(config, (dict, str, os.PathLike)):
            raise ValueError(f"DeepSpeedConfig takes a config dict or a path to a config file, got "
                             f"{type(config).__name__}; pass one of those")
        world_size, rank = _world(mpu)
        resolved = resolve_config(unread_offload_dropped(config, say=False), world_size)  # as initialize reads it
        parsed = with_items(resolved.config, given_dict(config))  # `_param_dict`: the config as given
        super().__init__(_ParsedConfig(parsed, world_size, rank))
        object.__setattr__(self, "_extra", {"timers_config": _timers(resolved.raw)})

    def __getattr__(self, name: str) -> Any:
        if name in READERS:
            return READERS[name](self._engine)
        if name in self._extra:
            return self._extra[name]
        raise AttributeError(f"DeepSpeedConfig has no attribute {name!r} in zero_core; read the config dict's "
                             "values directly (the names it answers are listed in docs/deepspeed.md)")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"DeepSpeedConfig.{name} is read-only in zero_core; change {name!r} in the config dict "
                             "and build a new DeepSpeedConfig")

    def __dir__(self) -> list[str]:
        return sorted([*READERS, *self._extra])

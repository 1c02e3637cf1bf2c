"""`engine._config`: the attributes of DeepSpeed's DeepSpeedConfig that scripts read, answered from zero_core's
validated config. Read-only: the engine was built from the config, so changing a value here would change nothing."""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

from .config_models import TORCH_DTYPES
from .config_optimizer_types import reported_name
from .engine_config_getters import wall_clock_on

_DTYPE_NAMES = {"fp32", "fp16", "bf16"}


def _section(engine: Any, name: str) -> dict:
    section = engine.config.get(name) if hasattr(engine.config, "get") else None
    return section if isinstance(section, dict) else {}


def _optimizer_name(engine: Any) -> str | None:
    """The config's optimizer type: DeepSpeed lower-cases the names of its own optimizers, torch's stay as written."""
    kind = _section(engine, "optimizer").get("type")
    return reported_name(kind) if isinstance(kind, str) else None


def _comm_dtype(engine: Any) -> torch.dtype | None:
    name = engine.config.communication_data_type
    return TORCH_DTYPES[name] if name in _DTYPE_NAMES else None  # None: not set, as DeepSpeed leaves it


def _copy_of(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A reader whose value is a copy: a script changing it must not reach the engine's config (the sections'
    models are frozen already; the dicts as given are not)."""
    return lambda engine: copy.deepcopy(read(engine))


def _plain(key: str) -> Callable[[Any], Any]:
    return lambda engine: getattr(engine.config, key)


def _getter(name: str) -> Callable[[Any], Any]:
    """The engine's getter of that name (engine_config_getters.py): one reading of each key."""
    return lambda engine: getattr(engine, name)()


_PLAIN = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "steps_per_print",
          "dump_state", "memory_breakdown", "prescale_gradients", "gradient_predivide_factor",
          "gradient_clipping", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "disable_allgather",
          "disable_python_gc", "managed_gradient_accumulation", "dataloader_drop_last", "log_level",
          "gradient_allreduce_op")

READERS: dict[str, Callable[[Any], Any]] = {
    **{key: _plain(key) for key in _PLAIN},
    "communication_data_type": _comm_dtype,
    "wall_clock_breakdown": lambda e: wall_clock_on(e.config),
    "grad_accum_dtype": lambda e: e.config.data_types.grad_accum_dtype if e.config.data_types else None,
    "zero_config": lambda e: e.config.zero_optimization,
    "zero_optimization_stage": lambda e: e.config.stage,
    "zero_enabled": lambda e: e.config.stage > 0,
    "float16_config": lambda e: e.config.fp16,
    "bfloat16_config": lambda e: e.config.bf16,
    "fp16_enabled": lambda e: bool(e.config.fp16.enabled),  # the older DeepSpeed releases' names
    "bfloat16_enabled": lambda e: bool(e.config.bf16.enabled),
    "optimizer_name": _optimizer_name,
    "optimizer_params": _copy_of(lambda e: _section(e, "optimizer").get("params")),
    "scheduler_name": lambda e: _section(e, "scheduler").get("type"),
    "scheduler_params": _copy_of(lambda e: _section(e, "scheduler").get("params")),
    **{key: _getter(key)
       for key in ("checkpoint_tag_validation_enabled", "checkpoint_tag_validation_fail", "load_universal_checkpoint",
                   "use_node_local_storage", "aio_config")},
    "monitor_config": lambda e: e.monitor.config,
    "world_size": lambda e: e.world_size,
    "global_rank": lambda e: e.rank,
    "_param_dict": _copy_of(lambda e: {k: e.config[k] for k in e.config.keys()}),
}


class DeepSpeedConfigView:
    """What `engine._config.<name>` answers on DeepSpeed, for the names in READERS."""

    __slots__ = ("_engine",)

    def __init__(self, engine: Any) -> None:
        object.__setattr__(self, "_engine", engine)

    def __getattr__(self, name: str) -> Any:
        read = READERS.get(name)
        if read is None:
            raise AttributeError(f"engine._config has no attribute {name!r} in zero_core; read the config's values "
                                 f"through engine.config[...] or the engine's getters (docs/deepspeed.md)")
        return read(self._engine)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"engine._config.{name} is read-only; set {name!r} in the config given to "
                             "deepspeed.initialize")

    def __dir__(self) -> list[str]:
        return sorted(READERS)

    def __repr__(self) -> str:
        return f"<zero_core view of DeepSpeedConfig: stage {self.zero_optimization_stage}, world {self.world_size}>"

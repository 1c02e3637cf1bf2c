"""`deepspeed.zero`: Init (a context around model construction) and GatheredParameters."""

from __future__ import annotations

from typing import Any

from ..deferred import init_context
from ..gathered import GatheredParameters

__all__ = ["Init", "GatheredParameters"]


class Init:
    """DeepSpeed's context for building a model under ZeRO-3: zero_core.init_context (the model is recorded on
    the meta device and `initialize` gives each rank only its shard, with eager construction's values).

    `config_dict_or_path` (or `config`) decides: below stage 3 the model is built normally, as it is with no
    config at all only when `enabled=False`. `remote_device`, `pin_memory`, `dtype` and the process-group
    arguments are accepted: where shards live and in which precision follow the config given to `initialize`."""

    def __init__(
        self,
        module: Any = None,
        data_parallel_group: Any = None,
        mem_efficient_linear: bool = True,
        remote_device: Any = None,
        pin_memory: bool = False,
        config_dict_or_path: Any = None,
        config: Any = None,
        enabled: bool = True,
        dtype: Any = None,
        mpu: Any = None,
        **kwargs: Any,
    ) -> None:
        if module is not None:
            raise NotImplementedError(
                "zero.Init(module=...) (partitioning an already-built model) is not supported by "
                "zero_core; build the model inside `with zero.Init():` or pass it to initialize"
            )
        self._context = init_context(
            config_dict_or_path if config_dict_or_path is not None else config, enabled=enabled
        )

    def __enter__(self) -> "Init":
        self._context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._context.__exit__(*exc)

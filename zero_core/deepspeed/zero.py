"""`deepspeed.zero`: Init (a context around model construction) and GatheredParameters."""

from __future__ import annotations

from typing import Any

from ..gathered import GatheredParameters

__all__ = ["Init", "GatheredParameters"]


class Init:
    """Context for building a model under ZeRO-3. The model is built normally here; `initialize` then shards it."""

    def __init__(self, module: Any = None, data_parallel_group: Any = None, mem_efficient_linear: bool = True,
                 remote_device: Any = None, pin_memory: bool = False, config_dict_or_path: Any = None,
                 config: Any = None, enabled: bool = True, dtype: Any = None, mpu: Any = None, **kwargs: Any) -> None:
        self.enabled = enabled

    def __enter__(self) -> "Init":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

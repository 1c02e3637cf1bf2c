"""`deepspeed.zero`: Init (a context around model construction), GatheredParameters and the external-parameter
registration calls."""

from __future__ import annotations

from typing import Any

from ..deferred import init_context
from ..gathered import GatheredParameters

__all__ = ["Init", "GatheredParameters", "register_external_parameter", "unregister_external_parameter"]


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


def register_external_parameter(module: Any, parameter: Any) -> None:
    """DeepSpeed's call for a parameter a module's forward reads from outside it (a tied embedding read by the
    head). zero_core's stage 3 gathers any released parameter a forward reads, registered or not
    (stages/released_params.py), so this only checks its arguments."""
    _check_registration("register_external_parameter", module, parameter)


def unregister_external_parameter(module: Any, parameter: Any) -> None:
    """The inverse of register_external_parameter: nothing to undo here."""
    _check_registration("unregister_external_parameter", module, parameter)


def _check_registration(call: str, module: Any, parameter: Any) -> None:
    import torch

    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"deepspeed.zero.{call}: the first argument must be a torch.nn.Module, not "
                         f"{type(module).__name__}; pass the module whose forward reads the parameter")
    if not isinstance(parameter, torch.nn.Parameter):
        raise ValueError(f"deepspeed.zero.{call}: the second argument must be a torch.nn.Parameter, not "
                         f"{type(parameter).__name__}; pass the parameter itself (e.g. other.weight)")

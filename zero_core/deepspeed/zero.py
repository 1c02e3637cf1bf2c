"""`deepspeed.zero`: Init (a context around model construction), GatheredParameters and the external-parameter
registration calls."""

from __future__ import annotations

from typing import Any

from ..deferred import init_context, stage_of
from ..gathered import GatheredParameters as _Gathered

__all__ = ["Init", "GatheredParameters", "register_external_parameter", "unregister_external_parameter"]


class GatheredParameters(_Gathered):
    """zero_core's GatheredParameters (zero_core/gathered.py) whose `with ... as x` binds None, as DeepSpeed 0.19.8's
    `__enter__` returns nothing for any `params` (None, one parameter, a list)."""

    def __enter__(self) -> None:  # type: ignore[override]
        super().__enter__()


class Init:
    """DeepSpeed's context for building a model under ZeRO-3: zero_core.init_context (the model is recorded on
    the meta device and `initialize` gives each rank only its shard).

    As DeepSpeed 0.19.8's zero.Init, floating tensors made here by torch's factories take one dtype (see
    initial_dtype): under a bf16 or fp16 config the parameters are bf16/fp16 from construction on, the weight
    initialisation runs in that dtype, and the fp32 master weights start from those 16-bit values. So the
    weights are eager construction's only under an fp32 config (then bitwise, at any world size).

    As DeepSpeed's, it records the model whatever stage `config_dict_or_path` (or `config`) names (DeepSpeed
    partitions it then too; the config decides only the dtype): only `enabled=False` builds it normally. Where
    DeepSpeed's engine then fails at the first forward of such a model under a stage-0-2 config, `initialize`
    makes it whole on every rank and trains it. `remote_device`, `pin_memory` and the process-group arguments
    are accepted: where shards live follows the config given to `initialize`."""

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
        config = config_dict_or_path if config_dict_or_path is not None else config
        if config is not None:
            stage_of(config)  # an unreadable config is refused in one line; its stage does not matter here
        self.dtype = initial_dtype(config, dtype)
        self._context = init_context(None, enabled=enabled, dtype=self.dtype)

    def __enter__(self) -> "Init":
        self._context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._context.__exit__(*exc)


def initial_dtype(config: Any, dtype: Any) -> Any:
    """The dtype DeepSpeed 0.19.8's zero.Init gives floating tensors (partition_parameters.py, `_set_dtype`).
    With a config and no `dtype`: bf16 if the config enables bf16, fp16 if it enables fp16, else fp32. Otherwise
    `dtype` (fp16 when None) where the accelerator supports fp16 (a GPU), else bf16 whatever `dtype` says."""
    import torch

    from .accelerator import get_accelerator

    if config is not None and dtype is None:
        bf16, fp16 = _enabled(config, "bf16"), _enabled(config, "fp16")
        if bf16 and fp16:
            raise ValueError("deepspeed.zero.Init: the config enables both bf16 and fp16; enable at most one")
        return torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32
    chosen = (dtype or torch.float16) if get_accelerator().is_fp16_supported() else torch.bfloat16
    if chosen not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"deepspeed.zero.Init: dtype={dtype} is not supported; pass torch.half, torch.bfloat16 "
                         "or torch.float")
    return chosen


def _enabled(config: Any, precision: str) -> bool:
    """Whether `config` (a dict, a JSON path or a ZeroConfig) enables `precision` ("bf16" or "fp16")."""
    import torch

    from ..config import ZeroConfig
    from ..config_file import config_data

    if isinstance(config, ZeroConfig):
        return config.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    config = config_data(config)
    if not isinstance(config, dict):
        return False  # init_context refuses it in one line
    names = ("bf16", "bfloat16") if precision == "bf16" else ("fp16",)  # "bfloat16": DeepSpeed's older name
    section = next((config[n] for n in names if n in config), None)
    value = section.get("enabled", False) if isinstance(section, dict) else False
    if not isinstance(value, bool):
        raise ValueError(f"deepspeed.zero.Init: {precision}.enabled is {value!r}; set it to true or false "
                         "before building the model (the precision decides the dtype of the weights)")
    return value


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

"""`deepspeed.runtime.zero.partition_parameters`: where DeepSpeed defines `Init`, `GatheredParameters` and the
per-parameter status `ZeroParamStatus` that save helpers test (`if param.ds_status == NOT_AVAILABLE: gather`).

At stage 3 `initialize` gives each parameter `ds_id` (a number unique in the process), `ds_numel` and `ds_shape`
(its full size) and `ds_status`, which follows the parameter's unit: `NOT_AVAILABLE` while it is released (each
rank keeps only its shard), `AVAILABLE` while it is gathered (inside the forward, `GatheredParameters`, or kept
whole because it is small). zero_core gathers synchronously, so `INFLIGHT` is never reported."""

from __future__ import annotations

import itertools
import sys
from enum import Enum
from typing import Any, Iterable

import torch

from ....deferred import factory_dtype
from ....deferred.factory_dtype import make_in_dtype
from ....stages.released_params import ReleasedParameter
from ...zero import GatheredParameters, Init, register_external_parameter, unregister_external_parameter

__all__ = ["GatheredParameters", "Init", "ZeroParamStatus", "ZeroParamType", "is_zero_param", "mark_zero_params",
           "register_external_parameter", "unregister_external_parameter"]


class ZeroParamType(Enum):
    NORMAL = 1
    PARTITIONED = 2
    REMOTE = 3


class ZeroParamStatus(Enum):
    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


_NEXT_ID = itertools.count()
_orig_torch_arange = torch.arange  # the names transformers' prevent_arange_dtype_change reads and replaces


def zero_wrapper_for_fp_tensor_constructor(fn: Any, target_fp_dtype: torch.dtype, target_device: Any = None) -> Any:
    """`fn` (a torch factory) making its floating tensors in `target_fp_dtype`, as zero.Init makes them."""
    return lambda *args, **kwargs: make_in_dtype(fn, args, kwargs, target_fp_dtype)


factory_dtype.wrapper_source = sys.modules[__name__]


def _released_status(self: Any) -> ZeroParamStatus:
    return ZeroParamStatus.NOT_AVAILABLE


def _keep_status(self: Any, value: Any) -> None:
    self.__dict__["ds_status"] = value  # what the parameter answers once gathered again


# a released parameter answers NOT_AVAILABLE over its own (AVAILABLE) attribute; gathered, it is a plain Parameter
ReleasedParameter.ds_status = property(_released_status, _keep_status)


def is_zero_param(parameter: Any) -> bool:
    return isinstance(parameter, torch.Tensor) and hasattr(parameter, "ds_id")


def mark_zero_params(params: Iterable[torch.nn.Parameter]) -> None:
    """Give each stage-3 parameter that lacks them `ds_id` and `ds_status` (see the module's docstring)."""
    for p in params:
        if not hasattr(p, "ds_id"):
            p.ds_id = next(_NEXT_ID)
            p.__dict__["ds_status"] = ZeroParamStatus.AVAILABLE

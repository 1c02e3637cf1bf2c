"""`deepspeed.utils.nvtx.instrument_w_nvtx`: a decorator marking each call of a function as a range named by its
qualified name in a GPU profiler's timeline (the accelerator's `range_push` / `range_pop`: nothing on the CPU)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ..accelerator import get_accelerator

enable_nvtx = True  # as DeepSpeed's module flag: set False to leave calls unmarked


def instrument_w_nvtx(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def marked(*args: Any, **kwargs: Any) -> Any:
        if not enable_nvtx or torch.compiler.is_compiling():  # a range inside a compiled graph would break it
            return func(*args, **kwargs)
        get_accelerator().range_push(func.__qualname__)
        try:
            return func(*args, **kwargs)
        finally:
            get_accelerator().range_pop()

    return marked

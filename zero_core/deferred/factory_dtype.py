"""The dtype DeepSpeed's zero.Init gives the tensors built inside it, applied while a construction is recorded.

DeepSpeed 0.19.8's zero.Init replaces eight torch factories (`torch.tensor`, `empty`, `zeros`, `ones`, `full`,
`arange`, `eye`, `randn`; deepspeed/runtime/zero/partition_parameters.py) with versions that convert what they
make, when it is floating point, to one dtype (bf16 under a bf16 config, fp16 under fp16, else fp32). Whatever
construction then does to such a tensor runs in that dtype: `kaiming_uniform_` on a bf16 weight draws bf16
values, which are not the bf16 roundings of the fp32 values eager construction draws. Integer tensors, tensors
made by other functions (`torch.rand`, `*_like`, arithmetic) and therefore most computed buffers keep their
dtype. Reproducing the conversion in the recording makes the replay (replay.py) compute exactly what
DeepSpeed's construction computes on the CPU.

Two more of its conversions (checked against DeepSpeed 0.19.8 on the CPU):
- `torch.Tensor(*sizes)`, the legacy constructor behind `nn.Parameter(torch.Tensor(out, in))`, makes an
  uninitialised tensor of that dtype (DeepSpeed replaces `torch.Tensor.__new__`). Its data form,
  `torch.Tensor([1.0, 2.0])`, raises a TypeError under DeepSpeed's; here torch makes it as usual.
- Each module's floating parameters are converted to the dtype when the module's construction ends (its
  outermost `__init__` returns; construction_end.py): DeepSpeed partitions them then, into buffers of that
  dtype. So a parameter made in another dtype (`torch.rand`, `torch.linspace`, `torch.FloatTensor(n)`, an fp16
  tensor) is computed in its own dtype and then rounded, before a parent's `apply(init_fn)` writes to it.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

import torch

CONVERTED = {torch.tensor, torch.empty, torch.zeros, torch.ones, torch.full, torch.arange, torch.eye, torch.randn}
# made in the target dtype at once: the same values as making them in fp32 and converting, without the fp32 copy
_SAME_IN_ANY_DTYPE = {torch.empty, torch.zeros, torch.ones, torch.eye}


# The module whose `zero_wrapper_for_fp_tensor_constructor` attribute wraps the CONVERTED factories: DeepSpeed's
# `partition_parameters` registers itself, so a caller that replaces that attribute (transformers'
# `prevent_arange_dtype_change`, which keeps `torch.arange`'s asked dtype) is honoured as on DeepSpeed.
wrapper_source: Any = None


def converted_factory(func: Any, dtype: torch.dtype, device: Any) -> Callable[..., Any]:
    """`func` as zero.Init makes it: through the registered wrapper where one is set, else `make_in_dtype`."""
    wrap = getattr(wrapper_source, "zero_wrapper_for_fp_tensor_constructor", None)
    if wrap is None:
        return lambda *args, **kwargs: make_in_dtype(func, args, kwargs, dtype)
    return wrap(func, dtype, target_device=device)


def make_in_dtype(func: Any, args: tuple, kwargs: dict, dtype: torch.dtype) -> Any:
    """`func(*args, **kwargs)` (one of CONVERTED), floating results converted to `dtype` as zero.Init does."""
    asked = kwargs.get("dtype")
    if func in _SAME_IN_ANY_DTYPE and kwargs.get("out") is None and (asked is None or asked.is_floating_point):
        return func(*args, **{**kwargs, "dtype": dtype})
    made = func(*args, **kwargs)
    if not isinstance(made, torch.Tensor) or not made.is_floating_point() or made.dtype == dtype:
        return made
    # computed in its own dtype first, then rounded (a randn drawn in fp32), as zero.Init's wrappers do
    return made.detach().to(dtype).requires_grad_(made.requires_grad)


def _sizes_only(args: tuple) -> bool:
    """Whether `torch.Tensor(*args)` is the sizes form (no data): ints, or one torch.Size, as torch reads them."""
    if len(args) == 1 and isinstance(args[0], torch.Size):
        return True
    return all(hasattr(a, "__index__") and not isinstance(a, (bool, torch.Tensor)) for a in args)


def legacy_new(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A `torch.Tensor.__new__` whose sizes form (`torch.Tensor(4, 8)`, `torch.Tensor()`) is `torch.empty`, so the
    recorder's factories make it (on the meta device, in zero.Init's dtype where one is given). Other forms and
    subclasses are `original`'s."""

    def new(cls: type, *args: Any, **kwargs: Any) -> torch.Tensor:
        if cls is not torch.Tensor or not _sizes_only(args) or set(kwargs) - {"device"}:
            return original(cls, *args, **kwargs)
        return torch.empty(*(args or (0,)), **kwargs)

    return new


def convert_parameters(params: Iterable[torch.nn.Parameter], dtype: torch.dtype,
                       recorded: Callable[[torch.Tensor], bool]) -> None:
    """Floating parameters of a finished module (`recorded` ones: made in the context) take `dtype`, as DeepSpeed's
    partitioning converts them; the conversion is recorded, so replay rounds the value computed up to here."""
    with torch.no_grad():
        for p in params:
            if p.is_floating_point() and p.dtype != dtype and recorded(p):
                p.data = p.data.to(dtype)


# Modules built under deepspeed.zero.Init with a dtype: their buffers keep the dtypes construction gave them (the
# engine casts other deferred models' buffers to the working precision, buffer_dtypes.py), as DeepSpeed's engine
# leaves zero.Init's buffers as they were made: a rotary table computed in fp32 stays fp32.
_CONVERTED_MODULES: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def mark_converted(modules: Iterable[torch.nn.Module]) -> None:
    _CONVERTED_MODULES.update(modules)


def built_converted(model: torch.nn.Module) -> bool:
    """Whether `model` (or a module in it) was built under deepspeed.zero.Init with its dtype rule."""
    return any(m in _CONVERTED_MODULES for m in model.modules())

"""`deepspeed.runtime.utils`: the helpers scripts import from it, each as DeepSpeed 0.19.8's behaves.

`see_memory_usage(message, force=True)`: the device's allocated and reserved memory (with their peaks, reset after
each report) and the host's used memory, printed by rank 0; without `force` nothing, as DeepSpeed's.
`move_to_device`, `clip_grad_norm_`, `get_global_norm`, `set_random_seed`, `empty_cache`, `noop_decorator`,
`noop_context`, `ensure_directory_exists`, `call_to_str`: below."""

from __future__ import annotations

import gc
import math
import os
import random
from typing import Any, Callable, Iterable

import numpy
import torch
import torch.distributed as dist

from ...meminfo import meminfo_bytes
from ..accelerator import get_accelerator

GiB = 1024**3


def _host_used() -> tuple[float, float]:
    """(GiB used, percent used) of the host's memory: MemTotal - MemAvailable."""
    fields = meminfo_bytes()
    used = fields["MemTotal"] - fields["MemAvailable"]
    return used / GiB, 100 * used / fields["MemTotal"]


def see_memory_usage(message: str, force: bool = False) -> None:
    if not force or (dist.is_initialized() and dist.get_rank() != 0):
        return
    gc.collect()  # what Python has not freed yet would count as used
    print(message, flush=True)
    if torch.cuda.is_available():
        cuda = torch.cuda
        print(f"MA {cuda.memory_allocated() / GiB:.2f} GB Max_MA {cuda.max_memory_allocated() / GiB:.2f} GB "
              f"CA {cuda.memory_reserved() / GiB:.2f} GB Max_CA {cuda.max_memory_reserved() / GiB:.2f} GB", flush=True)
        torch.cuda.reset_peak_memory_stats()
    try:
        used, percent = _host_used()
        print(f"CPU Virtual Memory: used = {used:.2f} GB, percent = {percent:.1f}%", flush=True)
    except KeyError:  # no /proc/meminfo
        print("CPU Virtual Memory: not readable on this host", flush=True)


def move_to_device(item: Any, device: Any, criterion_func: Callable[[Any], bool] | None = None) -> Any:
    """`item` with its tensors on `device`, through nested lists, tuples and dicts (new containers).

    Without `criterion_func` every leaf is `leaf.to(device)` (so a leaf without `.to`, an int, raises as in
    DeepSpeed). With it, a leaf (or container) it accepts is moved in place (its `.data` swapped, the same object
    returned) and any other leaf is `.to(device)` as well, as DeepSpeed's does."""
    if criterion_func is not None and criterion_func(item):
        item.data = item.to(device).data
        return item
    if isinstance(item, (list, tuple)):
        moved = [move_to_device(v, device, criterion_func) for v in item]
        return moved if isinstance(item, list) else tuple(moved)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    return item.to(device)


def _bad_norm(norm: Any) -> bool:
    """A norm that cannot be a true one: inf, nan or negative (a tensor: any element)."""
    if torch.is_tensor(norm):
        return bool((~torch.isfinite(norm) | (norm < 0)).any())
    return not math.isfinite(float(norm)) or norm < 0


def get_global_norm(norm_list: Iterable[Any]) -> float:
    """sqrt of the sum of squares of the norms; inf where any is inf, nan or negative."""
    norms = list(norm_list)
    if any(_bad_norm(n) for n in norms):
        return float("inf")
    return math.sqrt(sum(n**2.0 for n in norms))


def _is_model_parallel(p: torch.Tensor) -> bool:
    return bool(getattr(p, "model_parallel", False) or getattr(p, "tensor_model_parallel", False))


def _grad_norm(params: list[torch.Tensor], norm_type: float, mpu: Any) -> torch.Tensor:
    """The p-norm of all the gradients as one vector (with `mpu`, over its model-parallel group: each parameter
    counted once, on its group's rank 0 unless it is split over the group)."""
    group = mpu.get_model_parallel_group() if mpu is not None else None
    if norm_type == math.inf:
        total = torch.stack([p.grad.detach().abs().max().float() for p in params]).max()
        total = total.to(get_accelerator().current_device_name())
        if mpu is not None:
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
        return total
    owned = [p for p in params if mpu is None or mpu.get_model_parallel_rank() == 0 or _is_model_parallel(p)]
    if owned:
        total = torch.stack([p.grad.detach().float().norm(norm_type) for p in owned]).pow(norm_type).sum().float()
    else:
        total = torch.zeros(1)
    total = total.to(get_accelerator().current_device_name())
    if mpu is not None:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total.pow(1.0 / norm_type)


def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2, mpu: Any = None) -> torch.Tensor:
    """Scale the gradients in place so that their joint `norm_type`-norm is at most `max_norm`; return the norm
    (averaged over the data-parallel ranks, as DeepSpeed's is; the same on every rank).

    As DeepSpeed's: the coefficient is min(1, max_norm / (norm + 1e-6)), and the norm is a 0-dim float tensor on
    the first parameter's device. Unlike DeepSpeed's it needs no process group (a single process is a world of
    one) and, with no gradient at all, returns tensor([0.]) where DeepSpeed's raises IndexError."""
    params = [parameters] if torch.is_tensor(parameters) else list(parameters)
    params = [p for p in params if p.grad is not None]
    norm_type = float(norm_type)
    if not params:
        return torch.zeros(1)
    total = _grad_norm(params, norm_type, mpu)
    if dist.is_initialized() and dist.get_world_size() > 1:  # DeepSpeed's mean over the data-parallel group
        total = total / float(dist.get_world_size())
        dist.all_reduce(total)
    total = total.to(params[0].device)
    coef = torch.clamp(torch.tensor([float(max_norm)], device=total.device) / (total + 1e-6), max=1.0)
    for p in params:
        p.grad.data.mul_(coef)
    return total


def set_random_seed(seed: int) -> None:
    """Seed Python's `random`, numpy (seed mod 2**32) and torch (seed mod 2**63), as DeepSpeed does."""
    random.seed(seed)
    numpy.random.seed(seed % (2**32))
    torch.manual_seed(seed % (2**63))


def empty_cache() -> None:
    """Release the device's cached memory and reset its peak counters (nothing on the CPU)."""
    get_accelerator().empty_cache()
    get_accelerator().reset_peak_memory_stats()


def noop_decorator(func: Callable) -> Callable:
    return func


class noop_context:
    """A context manager that does nothing."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def ensure_directory_exists(filename: str) -> None:
    """Create the folder `filename` is in (and its parents) if missing; `filename` itself is not created."""
    os.makedirs(os.path.dirname(filename), exist_ok=True)


def call_to_str(base: str, *args: Any, **kwargs: Any) -> str:
    """The call written out: `call_to_str("f", 1, k="a")` is `"f(1, k='a')"` (reprs of the arguments)."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{base}({', '.join(parts)})"

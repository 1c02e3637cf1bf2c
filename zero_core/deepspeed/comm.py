"""`deepspeed.comm` as training scripts call it (`import deepspeed.comm as dist`). DeepSpeed's initialize always
creates a process group; zero_core creates none for a single process, so here a world of one answers without
one (rank 0 of 1; collectives leave their tensors as they are). Anything else is torch.distributed's."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .. import comm as zero_comm


def is_initialized() -> bool:
    return dist.is_initialized()


def get_rank(group: Any = None) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def get_world_size(group: Any = None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def get_local_rank() -> int:
    return zero_comm.local_rank()


def barrier(group: Any = None, **kw: Any) -> None:
    if dist.is_initialized():
        dist.barrier(group=group, **kw)


def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Any:
    if dist.is_initialized():
        return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    return None  # one rank: sum, mean, min and max of one tensor are the tensor


def broadcast(tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False) -> Any:
    if dist.is_initialized():
        return dist.broadcast(tensor, src, group=group, async_op=async_op)
    return None


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    if dist.is_initialized():
        return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)
    tensor_list[0].copy_(tensor)
    return None


def init_distributed(*args: Any, **kwargs: Any) -> None:
    from . import init_distributed as create

    create(*args, **kwargs)


def log_summary(show_straggler: bool = False, return_dict: bool = False) -> dict | None:
    """DeepSpeed prints its comms logger's table here; zero_core keeps no comms log (the config's comms_logger is
    accepted and ignored), so nothing is printed and the dict, when asked for, is empty."""
    return {} if return_dict else None


def __getattr__(name: str) -> Any:  # ReduceOp, new_group, ...: torch.distributed's own
    return getattr(dist, name)

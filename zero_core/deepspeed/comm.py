"""`deepspeed.comm` as training scripts call it (`import deepspeed.comm as dist`). DeepSpeed's initialize always creates
a process group; zero_core creates none for a single process, so here a world of one answers without one (rank 0 of
1; collectives leave their tensors as they are). Names DeepSpeed adds (allgather_fn, reduce_scatter_fn, has_*, ...)
are over torch.distributed; anything else is torch.distributed's, and a name neither has is refused in one line.
`ReduceOp` is DeepSpeed's own enum, which the collectives here turn into torch.distributed's."""

from __future__ import annotations

import enum
import os
from typing import Any

import torch
import torch.distributed as dist

from .. import comm as zero_comm
from ..comm_release import backend_holds  # a script's last collective, waited for at exit


class ReduceOp(enum.Enum):
    """DeepSpeed's reduction names and numbers (its deepspeed.comm.ReduceOp): scripts iterate it, compare with it and
    print it, so it is not torch's ReduceOp, and neither's members equal the other's. Every collective here takes
    either."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BAND = 4
    BOR = 5
    BXOR = 6
    AVG = 7
    UNUSED = 8


def _torch_op(op: Any) -> Any:
    """torch.distributed's reduction for `op` (a torch ReduceOp passes as it is)."""
    if not isinstance(op, ReduceOp):
        return op
    if op is ReduceOp.UNUSED:  # DeepSpeed hands it to torch, which fails inside the collective
        raise ValueError("deepspeed.comm.ReduceOp.UNUSED names no reduction; pass SUM, PRODUCT, MIN, MAX, BAND, BOR, "
                         "BXOR or AVG")
    return getattr(dist.ReduceOp, op.name)


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


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
               prof: bool = False, log_name: str = "all_reduce", debug: Any = None) -> Any:
    op = _torch_op(op)
    if dist.is_initialized():
        with backend_holds(tensor):
            return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    return None  # one rank: sum, mean, min and max of one tensor are the tensor


def all_reduce_coalesced(tensors: list[torch.Tensor], op: Any = ReduceOp.SUM, group: Any = None,
                         async_op: bool = False) -> Any:
    op = _torch_op(op)
    if dist.is_initialized():
        with backend_holds(*tensors):
            return dist.all_reduce_coalesced(tensors, op=op, group=group, async_op=async_op)
    return None


def reduce(tensor: torch.Tensor, dst: int, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
           prof: bool = False, log_name: str = "reduce", debug: Any = None) -> Any:
    op = _torch_op(op)
    if dist.is_initialized():
        with backend_holds(tensor):
            return dist.reduce(tensor, dst, op=op, group=group, async_op=async_op)
    return None


def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: Any = ReduceOp.SUM, group: Any = None,
                   async_op: bool = False, prof: bool = False, log_name: str = "reduce_scatter",
                   debug: Any = None) -> Any:
    op = _torch_op(op)
    if dist.is_initialized():
        with backend_holds(output, *input_list):
            return dist.reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)
    output.copy_(input_list[0])
    return None


def reduce_scatter_tensor(output_tensor: torch.Tensor, tensor: torch.Tensor, op: Any = ReduceOp.SUM,
                          group: Any = None, async_op: bool = False, prof: bool = False,
                          log_name: str = "reduce_scatter_tensor", debug: Any = None) -> Any:
    return reduce_scatter_fn(output_tensor, tensor, op=op, group=group, async_op=async_op)


def broadcast(tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False) -> Any:
    if dist.is_initialized():
        with backend_holds(tensor):
            return dist.broadcast(tensor, src, group=group, async_op=async_op)
    return None


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    if dist.is_initialized():
        with backend_holds(tensor, *tensor_list):
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


def allgather_fn(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None,
                 async_op: bool = False, debug: Any = None) -> Any:
    """Each rank's `input_tensor` side by side into `output_tensor` (all_gather_into_tensor)."""
    if dist.is_initialized():
        with backend_holds(output_tensor, input_tensor):
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
    output_tensor.copy_(input_tensor.reshape(output_tensor.shape))
    return None


def reduce_scatter_fn(output_tensor: torch.Tensor, tensor: torch.Tensor, op: Any = ReduceOp.SUM,
                      group: Any = None, async_op: bool = False, prof: bool = False, debug: Any = None) -> Any:
    """This rank's part of `tensor` reduced over the ranks, into `output_tensor` (reduce_scatter_tensor)."""
    op = _torch_op(op)
    if dist.is_initialized():
        with backend_holds(output_tensor, tensor):
            return dist.reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op)
    output_tensor.copy_(tensor.reshape(output_tensor.shape))
    return None


def inference_all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None,
                         async_op: bool = False, prof: bool = False, log_name: str = "all_reduce",
                         debug: Any = None) -> Any:
    return all_reduce(tensor, op=op, group=group, async_op=async_op)


def has_all_gather_into_tensor() -> bool:
    return hasattr(dist, "all_gather_into_tensor")


def has_reduce_scatter_tensor() -> bool:
    return hasattr(dist, "reduce_scatter_tensor")


def has_all_reduce_coalesced() -> bool:
    return hasattr(dist, "all_reduce_coalesced")


def get_world_group() -> Any:
    return dist.group.WORLD


def get_all_ranks_from_group(group: Any = None) -> list[int]:
    """The global ranks of `group`'s members, in its rank order. DeepSpeed 0.19.8 asks the group for its ranks one by
    one until it refuses: None is no group it knows, so the answer is [], as here; the world's group never refuses,
    so DeepSpeed's call never returns for it, where this one gives every rank."""
    if group is None or not dist.is_initialized():
        return []
    return dist.get_process_group_ranks(group)


def get_world_rank_from_launcher() -> int:
    return int(os.environ.get("RANK", "0"))


def get_world_size_from_launcher() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


class _CommsLogger:
    """DeepSpeed's comms logger, off: zero_core records no per-collective log (see log_summary)."""

    enabled, prof_all, verbose, debug = False, False, False, False

    def __init__(self) -> None:
        self.prof_ops: list[str] = []
        self.comms_dict: dict = {}

    def configure(self, comms_config: Any = None) -> None:
        """Accepted; nothing is logged."""


comms_logger = _CommsLogger()


def configure(deepspeed_config: Any = None, enabled: bool | None = None, prof_all: bool | None = None,
              prof_ops: list[str] | None = None, verbose: bool | None = None, debug: bool | None = None) -> None:
    """DeepSpeed's comms-logger settings: accepted, nothing is logged (see log_summary)."""


def timed_op(func: Any) -> Any:
    """DeepSpeed's timing wrapper of a collective: the collective itself (zero_core times none)."""
    return func


def init_deepspeed_backend(ds_backend: Any, timeout: Any, init_method: Any) -> None:
    """DeepSpeed's own (ccl, mpi, ...) backends are not used: zero_core communicates through torch.distributed,
    whose group init_distributed creates."""


def __getattr__(name: str) -> Any:  # new_group, get_global_rank, ...: torch.distributed's own
    if name.startswith("__") or hasattr(dist, name):
        return getattr(dist, name)
    raise AttributeError(f"deepspeed.comm.{name} is not provided by zero_core (neither among its deepspeed.comm "
                         "calls nor in torch.distributed); docs/deepspeed.md lists what deepspeed.comm answers")

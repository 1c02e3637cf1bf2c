"""`deepspeed.utils.groups`: the process-group queries scripts make (`groups.get_data_parallel_world_size()`,
`groups._get_data_parallel_rank()`, ...). zero_core trains data-parallel only, so every rank is in the one
data-parallel group (torch's default group), and the model, tensor and sequence parallel sizes are 1.
Expert-parallel groups (mixture of experts) are not provided: naming one is refused in one line."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def get_data_parallel_group() -> Any:
    """Every rank's group (torch's default group; None in a single process without one)."""
    return dist.group.WORLD if dist.is_initialized() else None


def get_data_parallel_world_size() -> int:
    return _world_size()


def get_data_parallel_rank() -> int:
    return _rank()


def get_model_parallel_world_size() -> int:
    return 1


def get_model_parallel_rank() -> int:
    return 0


get_tensor_model_parallel_world_size = get_model_parallel_world_size
get_tensor_model_parallel_rank = get_model_parallel_rank
_get_data_parallel_group = _get_sequence_data_parallel_group = get_data_parallel_group
_get_data_parallel_world_size = _get_sequence_data_parallel_world_size = get_data_parallel_world_size
_get_data_parallel_rank = _get_sequence_data_parallel_rank = get_data_parallel_rank
_get_model_parallel_world_size = _get_sequence_parallel_world_size = get_model_parallel_world_size
_get_sequence_parallel_rank = get_model_parallel_rank


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"deepspeed.utils.groups.{name} is not provided by zero_core: it trains data-parallel only "
                         "(no model, expert or sequence parallel groups); use get_data_parallel_group() and its "
                         "world size and rank")

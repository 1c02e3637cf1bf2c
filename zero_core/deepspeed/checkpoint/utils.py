"""`deepspeed.checkpoint.utils.clone_tensors_for_torch_save`, which Accelerate's `get_state_dict` and scripts call
before `torch.save`: a copy of a nested structure whose tensors are detached copies on `device`, so that the file
holds each tensor's own values, not the whole storage a view shares."""

from __future__ import annotations

from typing import Any

import torch


def clone_tensors_for_torch_save(item: Any, device: torch.device | str = torch.device("cpu")) -> Any:
    """`item` with every tensor in it (through lists, tuples and dicts) replaced by a detached copy on `device`."""
    if isinstance(item, torch.Tensor):
        target = torch.device(device)
        return item.detach().clone() if item.device == target else item.detach().to(target)
    if isinstance(item, dict):
        return {k: clone_tensors_for_torch_save(v, device) for k, v in item.items()}
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    return item

"""Offload sections DeepSpeed does not read at the config's ZeRO stage. DeepSpeed 0.19.8 reads
`zero_optimization.offload_param` at stage 3 only and `offload_optimizer` at stages 1-3; below those it trains as
if they were absent and says nothing, and DeepSpeed-Chat's configs set both with `--offload` whatever `--zero_stage`
is. zero_core's config check refuses them there, so configs reaching it through DeepSpeed's API leave them out."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from ..config_file import config_data

# (section, DeepSpeed's deprecated boolean for it, the lowest ZeRO stage DeepSpeed reads it at)
_STAGED_OFFLOAD = (("offload_param", "cpu_offload_param", 3), ("offload_optimizer", "cpu_offload", 1))


def _offloads(value: Any) -> bool:
    device = value.get("device", "none") if isinstance(value, dict) else None
    return value is True or (device is not None and device != "none")


def unread_offload_dropped(config: Any, say: bool = True) -> Any:
    """`config` (a dict or a path) as a dict without the offload sections DeepSpeed would not read, or `config`
    itself where there are none; with `say`, rank 0 names what was left out in one line."""
    data = config_data(config)
    zero = data.get("zero_optimization") if isinstance(data, dict) else None
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if type(stage) is not int:
        return config  # no zero section, or a stage the config check names
    unread = [name for section, boolean, lowest in _STAGED_OFFLOAD if stage < lowest for name in (section, boolean)
              if _offloads(zero.get(name))]
    if not unread:
        return config
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    if say and rank == 0:
        names = " and ".join(f"zero_optimization.{name}" for name in unread)
        verb = "is" if len(unread) == 1 else "are"
        print(f"zero_core: {names} {verb} left out: DeepSpeed does not read {'it' if verb == 'is' else 'them'} at "
              f"ZeRO stage {stage} (offload_param only at stage 3, offload_optimizer at stages 1-3)", flush=True)
    return {**data, "zero_optimization": {k: v for k, v in zero.items() if k not in unread}}

"""`deepspeed.utils.safe_get_full_fp32_param(param)` and `safe_get_full_optimizer_state(param, key)`: one
parameter's whole fp32 master or Adam moment ("exp_avg", "exp_avg_sq"), from the engine that trains it.
Collective, as in DeepSpeed: every rank calls it for the same parameter (its group is all-gathered). A
parameter no zero_core engine trains gives None, as DeepSpeed's does for one it does not partition."""

from __future__ import annotations

import torch

from ...gathered import _OWNER
from ...model_export import gathered_group, settled


def _full_state(param: torch.Tensor, name: str) -> torch.Tensor | None:
    engine = _OWNER.get(id(param))
    if engine is None:
        return None
    found = next(((g, s) for g in engine.layout.groups for s in g.slots if engine.params[s.index] is param), None)
    if found is None:  # frozen: it has no master or moments
        return None
    group, slot = found
    states = engine.optimizer.states
    if name not in getattr(states, "names", ("master", "exp_avg", "exp_avg_sq")):
        raise ValueError(f"the optimizer keeps no {name!r} state (it keeps {', '.join(states.names)}); ask for one "
                         "of those")
    settled(engine)  # between backward and step, or with a delayed update running: the last step's states
    full = gathered_group(engine, group, name).to(engine.device)
    return full[slot.offset : slot.offset + slot.numel].view(slot.shape).clone()


def safe_get_full_fp32_param(param: torch.Tensor) -> torch.Tensor | None:
    return _full_state(param, "master")


def safe_get_full_optimizer_state(param: torch.Tensor, optim_state_key: str) -> torch.Tensor | None:
    if optim_state_key not in ("exp_avg", "exp_avg_sq"):
        raise ValueError(f"optimizer state {optim_state_key!r} is not kept by zero_core's Adam; ask for 'exp_avg' "
                         "or 'exp_avg_sq'")
    return _full_state(param, optim_state_key)

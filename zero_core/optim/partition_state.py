"""`optimizer.state_dict()` / `load_state_dict()` on the optimizer `initialize` returns: as DeepSpeed's ZeRO
optimizers, this rank's partition of the optimizer states (fp32 master and Adam moments), its step counts and
the loss scaler, as plain CPU tensors and numbers. It loads back only into the same partition (same stage,
world size and rank); checkpoints that move between those are engine.save_checkpoint / load_checkpoint's."""

from __future__ import annotations

import math
from typing import Any

import torch

from .client_optimizer import ClientOptimizer
from .states import NAMES

FORMAT = "zero_core optimizer partition"  # marks a dict this module made
_INSTEAD = "save and resume with engine.save_checkpoint(dir) / engine.load_checkpoint(dir), which also move " \
           "between stages and world sizes"
_HYPER = ("lr", "betas", "eps", "weight_decay")


def _refuse(what: str) -> ValueError:
    return ValueError(f"optimizer.load_state_dict: {what}; {_INSTEAD}")


def _check_engine(engine: Any) -> None:
    if engine is None or isinstance(engine.optimizer, ClientOptimizer):
        raise ValueError(f"this optimizer's states are not readable through its state_dict here; {_INSTEAD}")


def _partition(engine: Any) -> dict[str, int]:
    return {"zero_stage": engine.stage, "partition_count": engine.world_size, "partition_rank": engine.rank,
            "partition_numel": engine.optimizer.states.numel}


def partition_state_dict(engine: Any, groups: list[dict]) -> dict[str, Any]:
    """This rank's states as of the last step, copied to the CPU (a host sync; states on NVMe are read in)."""
    from ..model_export import settled

    _check_engine(engine)
    settled(engine)
    opt, numel = engine.optimizer, engine.optimizer.states.numel
    state = {n: torch.empty(numel, dtype=torch.float32) for n in NAMES}
    with torch.no_grad():
        for lo, hi, views in opt.states.stream(NAMES, write_back=False):
            for n in NAMES:
                state[n][lo:hi].copy_(views[n])
    return {
        "format": FORMAT,
        **_partition(engine),
        "state": state,
        "applied": float(opt.applied.item()),
        "skipped": float(opt.skipped.item()),
        "loss_scaler": {k: v.cpu() if isinstance(v, torch.Tensor) else v
                        for k, v in engine.scaler.state_dict().items()},
        "param_groups": [{k: g[k] for k in _HYPER if k in g} for g in groups],
    }


def _checked(engine: Any, sd: Any) -> dict[str, torch.Tensor]:
    """The dict's state tensors, once it is known to be this partition's (nothing is changed before)."""
    if not isinstance(sd, dict) or sd.get("format") != FORMAT:
        raise _refuse("it takes only what this optimizer's state_dict() returned (a zero_core partition)")
    mine = _partition(engine)
    saved = {k: sd.get(k) for k in mine}
    if saved != mine:
        raise _refuse(f"the states are of another partition ({saved}; this one is {mine})")
    state = sd.get("state")
    numel = mine["partition_numel"]
    if not isinstance(state, dict) or any(
            not isinstance(state.get(n), torch.Tensor) or state[n].dtype != torch.float32
            or state[n].shape != (numel,) for n in NAMES):
        raise _refuse(f"its 'state' must hold {', '.join(NAMES)} as float32 tensors of {numel} elements")
    for key in ("applied", "skipped"):
        if not isinstance(sd.get(key), (int, float)) or isinstance(sd.get(key), bool) or not sd[key] >= 0:
            raise _refuse(f"its {key!r} must be a count >= 0")
    if not isinstance(sd.get("loss_scaler"), dict):
        raise _refuse("its 'loss_scaler' must be a dict")
    groups = sd.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) and _hyper_ok(g) for g in groups):
        raise _refuse("its 'param_groups' must be a list of dicts of lr, betas, eps and weight_decay numbers")
    return state


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _hyper_ok(group: dict) -> bool:
    betas = group.get("betas", (0.0, 0.0))
    pair = isinstance(betas, (list, tuple)) and len(betas) == 2 and all(_number(b) for b in betas)
    return pair and all(_number(group.get(k, 0.0)) for k in ("lr", "eps", "weight_decay"))


def load_partition_state_dict(engine: Any, sd: Any, groups: list[dict]) -> None:
    """Put a partition_state_dict of this same partition back: states, counts, loss scaler, groups' values."""
    from ..model_export import settled

    _check_engine(engine)
    state = _checked(engine, sd)
    saved_groups = sd["param_groups"]
    if len(saved_groups) != len(groups):
        raise _refuse(f"it has {len(saved_groups)} param_groups and this optimizer {len(groups)}")
    settled(engine)
    opt = engine.optimizer
    with torch.no_grad():
        for lo, hi, views in opt.states.stream(NAMES):
            for n in NAMES:
                views[n].copy_(state[n][lo:hi])
        opt.applied.fill_(float(sd["applied"]))
        opt.skipped.fill_(float(sd["skipped"]))
        engine.scaler.load_state_dict(sd["loss_scaler"])
        for group, saved in zip(groups, saved_groups):
            group.update({k: tuple(saved[k]) if k == "betas" else saved[k] for k in _HYPER if k in saved})
        engine.refresh_working_weights()

"""`load_state_dict()` on a torch Adam/AdamW passed to `initialize`, whose `state` is the engine's (state_view.py).

On DeepSpeed that optimizer's state is the one the engine steps, so what it loads is what the next update starts
from; here its `state` is a view of the engine's states, so the load goes into them (device, host or NVMe) and
`state` stays that view. torch's own load still checks the groups and takes their options (lr, betas, ...), which
the next update reads (group_values.py).

The dict is what this optimizer's `state_dict()` returned on this rank: per parameter this rank's share of
`exp_avg` and `exp_avg_sq`, and a `step`. zero_core's Adam keeps one step count for all parameters, and that count
also places the lr schedule, so states saved at another step than the engine's cannot be loaded as DeepSpeed loads
them (its step is per parameter, its schedule apart): they are refused in one line naming engine.load_checkpoint,
which restores the count, the schedule and the states together. Everything is checked before anything changes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

_MOMENTS = ("exp_avg", "exp_avg_sq")
_INSTEAD = ("load what this optimizer's state_dict() returned on this rank at the engine's current step, or resume "
            "with engine.load_checkpoint(dir), which restores the step count, the schedule and the states together")


def watch_loads(optimizer: torch.optim.Optimizer, view: Any) -> None:
    """Hooks on `optimizer`'s load_state_dict (torch runs them for every load) that put what it loads into the
    states `view` (a PartitionState) reads, and point its `state` back at `view`."""
    pending: list[dict[int, tuple[int, int, torch.Tensor, torch.Tensor]]] = []

    def before(opt: torch.optim.Optimizer, state_dict: Any) -> Any:
        pending.clear()
        engine = view.engine()
        if engine is None:  # the engine is gone: a plain torch load
            return None
        loaded = checked_moments(engine, view, opt.param_groups, state_dict)
        if loaded is None:  # groups that do not match: torch's own load says so
            return None
        pending.append(loaded)
        return {**state_dict, "state": {}}  # torch takes the groups' options; the moments go to the engine

    def after(opt: torch.optim.Optimizer) -> None:
        if pending:
            write_moments(view.engine(), pending.pop())
            opt.state = view

    optimizer.register_load_state_dict_pre_hook(before)
    optimizer.register_load_state_dict_post_hook(after)


def _refuse(what: str) -> ValueError:
    return ValueError(f"optimizer.load_state_dict: {what}; {_INSTEAD}")


def checked_moments(engine: Any, view: Any, groups: list[dict], sd: Any) -> dict | None:
    """id(parameter) -> (start, end, exp_avg, exp_avg_sq) of its share in the partition, for every parameter the
    engine trains; None where the dict's groups do not match `groups` (torch's load refuses those itself)."""
    if not isinstance(sd, dict) or not isinstance(sd.get("state"), dict) or not isinstance(sd.get("param_groups"),
                                                                                           list):
        return None
    saved = sd["param_groups"]
    if len(saved) != len(groups) or any(not isinstance(s, dict) or not isinstance(s.get("params"), list)
                                        or len(s["params"]) != len(g["params"]) for s, g in zip(saved, groups)):
        return None
    index = {key: p for s, g in zip(saved, groups) for key, p in zip(s["params"], g["params"])}
    shares = view.shares_of(engine)
    trained = [(key, p) for key, p in index.items() if id(p) in shares]
    states = sd["state"]
    given = [(key, p) for key, p in trained if key in states]
    if given and len(given) != len(trained):
        raise _refuse(f"it holds the states of {len(given)} of the {len(trained)} trained parameters, and "
                      "zero_core's Adam keeps them all at one step")
    count = float(engine.optimizer.applied.item())
    steps = {_step(key, states[key]) for key, _ in given} or {0.0}  # no states: saved before the first update
    if steps != {count}:
        shown = ", ".join(f"{s:g}" for s in sorted(steps))
        raise _refuse(f"the saved states are at step {shown} and this engine's at step {count:g}; zero_core's Adam "
                      "keeps one step count, which also places the lr schedule")
    out = {}
    for key, p in trained:
        start, end, _ = shares[id(p)]
        if key in states:
            exp_avg, exp_avg_sq = (_moment(key, states[key], name, end - start) for name in _MOMENTS)
        else:
            exp_avg = exp_avg_sq = torch.zeros(end - start)
        out[id(p)] = (start, end, exp_avg, exp_avg_sq)
    return out


def _step(key: Any, state: Any) -> float:
    if not isinstance(state, dict) or sorted(state) != sorted(("step", *_MOMENTS)):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise _refuse(f"the state of parameter {key!r} must hold step, exp_avg and exp_avg_sq (zero_core's Adam "
                      f"keeps no other), got {got}")
    step = state["step"]
    if isinstance(step, torch.Tensor) and step.numel() == 1 and not step.is_complex():
        step = step.item()
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) or step < 0 \
            or step != int(step):
        raise _refuse(f"the step of parameter {key!r} must be a whole number >= 0, got {step!r}")
    return float(step)


def _moment(key: Any, state: dict, name: str, numel: int) -> torch.Tensor:
    value = state[name]
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() != numel:
        got = f"{value.numel()} elements" if isinstance(value, torch.Tensor) else type(value).__name__
        raise _refuse(f"{name} of parameter {key!r} must be a floating tensor of this rank's {numel} elements of "
                      f"it, got {got}")
    return value.detach().reshape(-1)


def write_moments(engine: Any, moments: dict) -> None:
    """The moments into the engine's states, chunk by chunk where they live."""
    from ..model_export import settled

    settled(engine)  # no update in flight that would write over them
    with torch.no_grad():
        for lo, hi, views in engine.optimizer.states.stream(_MOMENTS, write_back=True):
            for start, end, *values in moments.values():
                a, b = max(lo, start), min(hi, end)
                if a < b:
                    for name, value in zip(_MOMENTS, values):
                        views[name][a - lo : b - lo].copy_(value[a - start : b - start])

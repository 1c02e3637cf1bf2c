"""The run-state fields of a zbench manifest: the optimizer's counts and hyper-parameters, the loss scaler and
the lr scheduler's position, each checked to be a number the engine can run on (manifest_checks.py checks the
rest). A crafted value is named in one line instead of being taken as saved: a loss scale of 0 makes every
gradient infinite, a position of 10**30 overflows the schedule's float arithmetic.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_COUNT = 1 << 53  # optimizer update counts: whole numbers a float64 holds exactly
_STATE_KEY = re.compile(r"state\.[A-Za-z_][A-Za-z0-9_]{0,63}")
_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def state_problem(m: dict[str, Any]) -> str | None:
    opt = m["optimizer"]
    keys = opt.get("state_keys", ["exp_avg", "exp_avg_sq"])
    if not (
        isinstance(keys, list)
        and len(keys) <= 32
        and all(isinstance(k, str) and (k in ("exp_avg", "exp_avg_sq") or _STATE_KEY.fullmatch(k)) for k in keys)
        and len(set(keys)) == len(keys)  # once every key is a str (a list among them is unhashable)
    ):
        return "optimizer.state_keys is not a list of state names"
    scalars = opt.get("client_scalars", {})
    if not (isinstance(scalars, dict) and len(scalars) <= 32 and all(_number(v) for v in scalars.values())):
        return "optimizer.client_scalars is not a table of numbers"
    for key in ("applied", "skipped"):
        if not (_number(opt.get(key)) and 0 <= opt[key] <= MAX_COUNT and float(opt[key]).is_integer()):
            return f"optimizer.{key} is missing or not a whole number of updates in 0..2**53"
    lrs = opt.get("group_lrs")
    if lrs is not None and not (
        isinstance(lrs, list) and 0 < len(lrs) <= 1 << 16 and all(_number(v) and v >= 0 for v in lrs)
    ):
        return "optimizer.group_lrs is not a list of non-negative numbers"
    problem = group_values_problem(opt.get("group_values")) or _run_settings_problem(opt)
    if problem:
        return problem
    if lrs is not None and opt.get("group_values") is not None and len(lrs) != len(opt["group_values"]):
        return (f"optimizer.group_lrs has {len(lrs)} entries but optimizer.group_values {len(opt['group_values'])}; "
                "a save records one of each per optimizer group")
    for key in ("lr", "eps", "weight_decay"):
        if opt.get(key) is not None and not _number(opt[key]):
            return f"optimizer.{key} is not a finite number"
    betas = opt.get("betas")
    if betas is not None and not (isinstance(betas, list) and len(betas) <= 4 and all(_number(b) for b in betas)):
        return "optimizer.betas is not a list of finite numbers"
    problem = _loss_scaler_problem(m["loss_scaler"]) or _scheduler_problem(m.get("scheduler", {}))
    if problem:
        return problem
    for rank, state in m["rng"].items():
        if not (isinstance(state, dict) and isinstance(state.get("torch"), str) and len(state["torch"]) < 1 << 16):
            return f"rng state of rank {rank!r} is not plain data"
    return None


def group_values_problem(record: Any) -> str | None:
    """Each group's weight_decay, eps (>= 0) and betas (two numbers in [0, 1)), as the engine's updates take them
    (absent in checkpoints saved before zbench recorded them)."""
    if record is None:
        return None
    if not (isinstance(record, list) and 0 < len(record) <= 1 << 16):
        return "optimizer.group_values is not a list with one entry per optimizer group"
    for i, entry in enumerate(record):
        if not isinstance(entry, dict) or set(entry) - {"weight_decay", "eps", "betas"}:
            return f"optimizer.group_values[{i}] is not a table of weight_decay, eps and betas"
        for key in ("weight_decay", "eps"):
            if key in entry and not (_number(entry[key]) and entry[key] >= 0):
                return f"optimizer.group_values[{i}].{key} is not a finite number >= 0"
        betas = entry.get("betas", [0.0, 0.0])
        if not (isinstance(betas, list) and len(betas) == 2 and all(_number(b) and 0 <= b < 1 for b in betas)):
            return f"optimizer.group_values[{i}].betas is not a pair of numbers in [0, 1)"
    return None


def _run_settings_problem(opt: dict[str, Any]) -> str | None:
    """The run's optimizer settings as recorded: the config's type name, decoupled weight decay, gradient clipping,
    and a client optimizer's class name, which a refusal quotes (no line break, no page of text)."""
    if opt.get("type") is not None and not (isinstance(opt["type"], str) and 0 < len(opt["type"]) <= 64):
        return "optimizer.type is not an optimizer's name"
    if opt.get("client") is not None and not (isinstance(opt["client"], str) and _CLASS_NAME.fullmatch(opt["client"])):
        return "optimizer.client is not an optimizer's class name"
    if opt.get("decoupled") is not None and not isinstance(opt["decoupled"], bool):
        return "optimizer.decoupled is not true or false"
    clip = opt.get("gradient_clipping")
    if clip is not None and not (_number(clip) and clip >= 0):
        return "optimizer.gradient_clipping is not a finite number >= 0"
    return None


def _whole(x: Any, lo: int) -> bool:
    return _number(x) and lo <= x <= MAX_COUNT and float(x).is_integer()


def _loss_scaler_problem(scaler: dict[str, Any]) -> str | None:
    """Numbers the scaler can run on: a scale of 0 would make every gradient infinite (each step skipped), a
    huge count overflow the schedule's arithmetic."""
    for key, value in scaler.items():
        v = value[0] if isinstance(value, list) and len(value) == 1 else value
        if not _number(v):
            return f"loss_scaler.{key!r} is not a number"
        if key == "cur_scale" and not 0 < v <= 2.0**126:  # its inverse stays a normal fp32
            return "loss_scaler.cur_scale is not a positive number up to 2**126"
        if key == "dynamic" and v not in (0, 1):
            return "loss_scaler.dynamic is not 0 or 1"
        if key in ("cur_iter", "cur_hysteresis", "min_scale_overflows", "last_overflow_iter") and not _whole(
                v, -1 if key == "last_overflow_iter" else 0):
            return f"loss_scaler.{key} is not a whole number of steps in range"
    return None


def _scheduler_problem(scheduler: Any) -> str | None:
    """DeepSpeed's position (`last_batch_iteration`, -1 before the first step, at the top or under
    `scheduler`) and a torch scheduler's `stepped` count are whole numbers a float64 holds exactly."""
    if not isinstance(scheduler, dict):
        return "'scheduler' is not an object"
    inner = scheduler.get("scheduler")
    for where, table in (("scheduler", scheduler), ("scheduler.scheduler", inner)):
        if isinstance(table, dict) and "last_batch_iteration" in table and not _whole(
                table["last_batch_iteration"], -1):
            return f"{where}.last_batch_iteration is not a whole number of steps in -1..2**53"
    if "stepped" in scheduler and not _whole(scheduler["stepped"], 0):
        return "scheduler.stepped is not a whole number of steps in 0..2**53"
    return None

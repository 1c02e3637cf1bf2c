"""Parameter groups: which parameters share which optimizer hyper-parameters, from what the caller gives.

    initialize(model, config)                                   one group: every trainable parameter
    initialize(model, config, model_parameters=[{...}, {...}])  torch-style groups; each may set lr,
                                                                weight_decay, betas, eps (else the config's)
    initialize(model, config, optimizer=torch.optim.AdamW(groups, ...))   the optimizer's own groups

A torch AdamW or Adam (the optimizers HF Trainer and most scripts build) runs on zero_core's fused
kernels with its groups' hyper-parameters; any other torch optimizer runs as it is over this rank's
fp32 shards (optim/client_optimizer.py). Every trainable parameter must be in exactly one group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from ..config_errors import ConfigError
from ..config_models import ZeroConfig
from ..config_optimizer_types import ELEMENTWISE_TORCH, arguments_of

# torch's element-wise optimizers: each element's update reads only that element's gradient and state
_ELEMENTWISE = tuple(getattr(torch.optim, n) for n in ("Adam", "AdamW", "Adagrad", *ELEMENTWISE_TORCH))
_GROUP_LABELS = ("name", "param_names", "initial_lr")  # what scripts and torch's schedulers add to a group
_ADAM_KEYS = {
    "params",
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "amsgrad",
    "maximize",
    "foreach",
    "capturable",
    "differentiable",
    "fused",
    "decoupled_weight_decay",
    "initial_lr",
    "name",
    "param_names",
}


@dataclass
class GroupSpec:
    """One optimizer group: its parameters and hyper-parameters (lr is the base lr, before any schedule)."""

    params: list[torch.nn.Parameter]
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    options: dict[str, Any] = field(default_factory=dict)  # the group dict as given (a client optimizer's)


@dataclass
class OptimizerPlan:
    groups: list[GroupSpec]
    kind: str  # "fused" (AdamW/Adam on zero_core's kernels) or "client" (a torch optimizer as it is)
    decoupled: bool = True  # AdamW-style weight decay (fused kind)
    client: torch.optim.Optimizer | None = None  # the caller's optimizer instance, if one was given

    def group_of(self) -> dict[int, int]:
        """id(parameter) -> group index."""
        return {id(p): g for g, spec in enumerate(self.groups) for p in spec.params}


def _number(value: Any, what: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _betas(value: Any, what: str) -> tuple[float, float]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ConfigError(f"{what} must be a pair of numbers (beta1, beta2), got {value!r}")
    b1, b2 = (_number(v, what) for v in value)
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ConfigError(f"{what} must lie in [0, 1), got {value!r}")
    return b1, b2


def _as_groups(given: Iterable[Any]) -> list[dict[str, Any]]:
    """torch's accepted forms: parameters, (name, parameter) pairs, or group dicts."""
    items = list(given)
    if not items:
        raise ConfigError("model_parameters is empty; pass the parameters to train (e.g. model.parameters())")
    if all(isinstance(i, dict) for i in items):
        return [dict(i) for i in items]
    if all(isinstance(i, tuple) and len(i) == 2 and isinstance(i[1], torch.Tensor) for i in items):
        return [{"params": [p for _, p in items]}]
    if all(isinstance(i, torch.Tensor) for i in items):
        return [{"params": items}]
    raise ConfigError(
        "model_parameters must be parameters, (name, parameter) pairs or torch-style group dicts, not a mix"
    )


def _check_membership(model: torch.nn.Module, groups: list[list[torch.nn.Parameter]]) -> None:
    owned = {id(p): n for n, p in model.named_parameters()}
    seen: set[int] = set()
    for g, params in enumerate(groups):
        for p in params:
            if id(p) not in owned:
                raise ConfigError(
                    f"parameter group {g} holds a tensor of shape {tuple(p.shape)} that is not a parameter "
                    "of the model; pass the model's own parameters"
                )
            if id(p) in seen:
                raise ConfigError(f"parameter '{owned[id(p)]}' is in two parameter groups; put it in one")
            seen.add(id(p))
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in seen]
    if missing:
        raise ConfigError(
            f"parameter '{missing[0]}' is trainable but in no parameter group ({len(missing)} such); "
            "add it to a group or set requires_grad=False"
        )


def _fused_kind(optimizer: torch.optim.Optimizer) -> bool | None:
    """decoupled weight decay for a torch AdamW/Adam the fused kernels reproduce; None for any other optimizer."""
    if type(optimizer) is torch.optim.AdamW:
        decoupled = True
    elif type(optimizer) is torch.optim.Adam:
        decoupled = bool(optimizer.defaults.get("decoupled_weight_decay", False))
    else:
        return None
    for g in optimizer.param_groups:
        for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
            if g.get(flag):
                raise ConfigError(
                    f"{type(optimizer).__name__}({flag}=True) is not supported by zero_core's fused update; drop {flag}"
                )
    return decoupled


def plan_optimizer(
    model: torch.nn.Module, cfg: ZeroConfig, model_parameters: Iterable[Any] | None = None, optimizer: Any = None
) -> OptimizerPlan:
    """The groups and the optimizer kind for `model` from the config and the caller's objects."""
    trainable = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad]
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise ConfigError(
                f"optimizer must be a torch.optim.Optimizer or a callable that builds one from the "
                f"parameters, got {type(optimizer).__name__}"
            )
        optimizer = optimizer(_as_groups(model_parameters) if model_parameters is not None else trainable)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(
                f"the optimizer callable returned {type(optimizer).__name__}, not a torch.optim.Optimizer"
            )
    if optimizer is not None:
        assert not cfg.optimizer_given, "the engine drops the config's optimizer section for a passed optimizer"
        decoupled = _fused_kind(optimizer)
        if decoupled is None and type(optimizer) not in _ELEMENTWISE and not cfg.zero_allow_untested_optimizer:
            raise ConfigError(
                f"{type(optimizer).__name__} is not known to update each element on its own (Lamb, "
                "Adafactor and LBFGS do not), and zero_core runs client optimizers on flat shards; if its "
                "update is element-wise, set zero_allow_untested_optimizer: true, else use AdamW"
            )
        specs = [
            GroupSpec(
                list(g["params"]),
                _number(g["lr"], f"param_groups[{i}].lr"),
                _betas(g.get("betas", (0.9, 0.999)), f"param_groups[{i}].betas"),
                _number(g.get("eps", 1e-8), f"param_groups[{i}].eps"),
                _number(g.get("weight_decay", 0.0), f"param_groups[{i}].weight_decay"),
                dict(g),
            )
            for i, g in enumerate(optimizer.param_groups)
        ]
        _check_membership(model, [s.params for s in specs])
        kind = "client" if decoupled is None else "fused"
        return OptimizerPlan(specs, kind, decoupled if decoupled is not None else True, optimizer)
    base = cfg.optimizer.params
    given = _as_groups(model_parameters) if model_parameters is not None else [{"params": trainable}]
    specs = []
    # a config-named torch optimizer (SGD, Adagrad, Lion, ...) takes its own arguments per group, as torch does
    named = cfg.optimizer.arguments is not None
    own = sorted(arguments_of(cfg.optimizer.type)) if named else ["lr", "betas", "eps", "weight_decay"]
    accepted = {"params", *_GROUP_LABELS, *own} if named else _ADAM_KEYS
    for i, g in enumerate(given):
        unknown = sorted(set(g) - accepted)
        if unknown:
            raise ConfigError(
                f"model_parameters[{i}] has the key '{unknown[0]}', which {cfg.optimizer.type} does not take; "
                f"use {', '.join(own)}"
            )
        params = [p for p in g.get("params", []) if p.requires_grad]
        specs.append(
            GroupSpec(
                params,
                _number(g.get("lr", base.lr), f"model_parameters[{i}].lr"),
                _betas(g.get("betas", base.betas), f"model_parameters[{i}].betas"),
                _number(g.get("eps", base.eps), f"model_parameters[{i}].eps"),
                _number(g.get("weight_decay", base.weight_decay), f"model_parameters[{i}].weight_decay"),
                dict(g),
            )
        )
    _check_membership(model, [s.params for s in specs])
    return OptimizerPlan([s for s in specs if s.params] or specs[:1], "fused", cfg.optimizer.decoupled)


def order_within(
    params: list[torch.nn.Parameter], bounds: list[int], group_of: dict[int, int]
) -> list[torch.nn.Parameter]:
    """`params` with each range [bounds[i], bounds[i+1]) stably sorted by optimizer group, so every bucket's
    shard holds one run per group: the update runs once per run with that group's hyper-parameters."""
    ends = bounds[1:] + [len(params)]
    out: list[torch.nn.Parameter] = []
    for lo, hi in zip(bounds, ends):
        out += sorted(params[lo:hi], key=lambda p: group_of[id(p)])
    return out


Run = tuple[int, int, int]  # [lo, hi) of the partition, optimizer group


def segment_runs(layout, rank: int, slot_groups: list[int]) -> list[list[Run]]:
    """Per layout group: this rank's shard cut into runs of one optimizer group, in partition coordinates,
    covering the whole shard (alignment padding joins a neighbouring run: its zeros stay zeros under any
    group's update)."""
    out = []
    for g in layout.groups:
        lo, hi = layout.shard_range(g.index, rank if layout.world_size > 1 else 0)
        runs: list[Run] = []
        for s in sorted(g.slots, key=lambda s: s.offset):
            a, b = max(lo, s.offset), min(hi, s.offset + s.numel)
            if a >= b:
                continue
            start, end, group = g.partition_offset + a - lo, g.partition_offset + b - lo, slot_groups[s.index]
            if runs and runs[-1][2] == group:
                runs[-1] = (runs[-1][0], end, group)
            elif runs:
                runs[-1] = (runs[-1][0], start, runs[-1][2])
                runs.append((start, end, group))
            else:
                runs.append((g.partition_offset, end, group))
        end_of_shard = g.partition_offset + g.shard_numel
        runs = [(r[0], r[1], r[2]) for r in runs] or [(g.partition_offset, end_of_shard, 0)]
        runs[-1] = (runs[-1][0], end_of_shard, runs[-1][2])
        out.append(runs)
    return out


def merged_runs(per_segment: list[list[Run]]) -> list[Run]:
    """All runs in partition order, neighbours of one group joined (the host update walks the partition)."""
    out: list[Run] = []
    for run in sorted((r for runs in per_segment for r in runs), key=lambda r: r[0]):
        if out and out[-1][2] == run[2] and out[-1][1] == run[0]:
            out[-1] = (out[-1][0], run[1], run[2])
        else:
            out.append(run)
    return out

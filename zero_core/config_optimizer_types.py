"""The optimizers a config's `optimizer.type` may name, read as DeepSpeed 0.19.8 reads the name
(runtime/config.py and engine._configure_basic_optimizer):

- DeepSpeed's own names match in any case: "Adam" and "AdamW" run on zero_core's fused kernels
  (config_optimizer_models.AdamParams); "Adagrad" is torch.optim.Adagrad, as DeepSpeed builds it without optimizer
  offload; "Lion" is optim/lion.py, DeepSpeed's FusedLion rule. Lamb, MuAdam, MuAdamW, MuSGD and Muon (and the
  1-bit optimizers of older DeepSpeed) are refused: zero_core does not implement them.
- Any other name is a torch.optim class, spelled exactly as DeepSpeed looks it up (getattr(torch.optim, name)).
  Those whose update of an element reads only that element's gradient and state run on this rank's fp32 shards,
  as a torch optimizer passed to initialize does (optim/client_optimizer.py); the rest are refused.

For every type but Adam/AdamW the `params` section is the optimizer's keyword arguments, as DeepSpeed passes it:
each key is checked against the class's constructor, and the values by building the class once on a placeholder
tensor (torch's own checks), so that a bad section fails when the config is loaded, in one line.
"""

from __future__ import annotations

import difflib
import inspect
import math
from typing import Any

import torch

from .config_errors import ConfigError, leaf, leaf_error, show

ADAM_TYPES = ("AdamW", "Adam")
# DeepSpeed's names (DEEPSPEED_OPTIMIZERS), matched lower-cased: those zero_core runs, and those it does not
_DEEPSPEED_OWN = {"adamw": "AdamW", "adam": "Adam", "adagrad": "Adagrad", "lion": "Lion"}
_NOT_IMPLEMENTED = {n.lower(): n for n in ("Lamb", "MuAdam", "MuAdamW", "MuSGD", "Muon", "OneBitAdam", "ZeroOneAdam",
                                           "OneBitLamb")}
# torch's optimizers whose update of each element reads only that element's gradient and state
ELEMENTWISE_TORCH = ("SGD", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta", "ASGD", "Rprop")
SUPPORTED = (*ADAM_TYPES, "Adagrad", "Lion", *ELEMENTWISE_TORCH)
_CHOICES = ", ".join(repr(n) for n in SUPPORTED)
_COMMON = ("lr", "weight_decay")  # what the groups, the lr schedules and the checkpoint's manifest read


def canonical_type(value: Any) -> str:
    """The stored name of the optimizer `value` names (a leaf error, one line with the fix, for any other)."""
    if not isinstance(value, str):
        raise leaf_error(f"one of {_CHOICES}", value)
    name = value.strip()
    if name.lower() in _DEEPSPEED_OWN:
        return _DEEPSPEED_OWN[name.lower()]
    if name.lower() in _NOT_IMPLEMENTED:
        raise leaf(f"'{value}' is a DeepSpeed optimizer zero_core does not implement; use one of {_CHOICES} "
                   "(the optimizers zero_core implements)")
    if name in ELEMENTWISE_TORCH:
        return name
    if name == "LBFGS":
        raise leaf("'LBFGS' needs a closure that evaluates the loss again, which engine.step() does not take; "
                   f"use one of {_CHOICES}")
    if isinstance(getattr(torch.optim, name, None), type):
        raise leaf(f"'{value}' (torch.optim.{name}) does not update each element on its own, and zero_core updates "
                   f"flat shards of the parameters; use one of {_CHOICES}")
    close = [n for n in ELEMENTWISE_TORCH if n.lower() == name.lower()]
    if close:  # DeepSpeed looks torch's names up as written: 'sgd' fails there too
        raise leaf(f"'{value}' is not a torch.optim class (the name is looked up as written, as DeepSpeed does); "
                   f"write '{close[0]}'")
    hint = difflib.get_close_matches(name, SUPPORTED, n=1, cutoff=0.6)
    raise leaf(f"'{value}' is neither a torch.optim class nor a DeepSpeed optimizer; "
               + (f"did you mean '{hint[0]}'?" if hint else f"use one of {_CHOICES}"))


def reported_name(name: str) -> str:
    """The name DeepSpeed's engine.optimizer_name() reports for a config's type: its own names lower-cased,
    torch's as written."""
    return name.lower() if name.strip().lower() in {**_DEEPSPEED_OWN, **_NOT_IMPLEMENTED} else name


def other_type(data: Any) -> str | None:
    """The stored name of a section's type other than Adam/AdamW (None: Adam/AdamW, or a type the model refuses)."""
    if not isinstance(data, dict):
        return None
    try:
        kind = canonical_type(data.get("type"))
    except Exception:  # the model's own validator reports it
        return None
    return None if kind in ADAM_TYPES else kind


def optimizer_class(kind: str) -> type[torch.optim.Optimizer]:
    if kind == "Lion":
        from .optim.lion import Lion  # imported here: the optim package imports the config models

        return Lion
    return getattr(torch.optim, kind)


def arguments_of(kind: str) -> list[str]:
    """The keyword arguments `kind`'s constructor takes after its parameters."""
    listed = list(inspect.signature(optimizer_class(kind).__init__).parameters.values())[2:]  # self, params
    return [p.name for p in listed if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def checked_arguments(kind: str, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """(`params` as `kind`'s keyword arguments, its resolved lr and weight_decay); a ConfigError names the key and
    the fix."""
    from .config_keys import refused_outright

    accepted = arguments_of(kind)
    defaults = {p.name: p.default for p in inspect.signature(optimizer_class(kind).__init__).parameters.values()}
    for key, value in params.items():
        if key == "max_grad_norm":  # DeepSpeed refuses it for every type
            raise ConfigError(f"key 'optimizer.params.max_grad_norm' is not supported by zero_core; "
                              f"{refused_outright()['optimizer.params.max_grad_norm']}")
        if key not in accepted:
            raise ConfigError(f"optimizer.params.{key} is not an argument of {kind}; remove it or use one of its "
                              f"arguments: {', '.join(accepted)}")
        _check_value(f"optimizer.params.{key}", defaults[key], value)
    try:
        probe = optimizer_class(kind)([torch.zeros(1, requires_grad=True)], **params)
    except (TypeError, ValueError, RuntimeError) as err:
        reason = " ".join(str(err).split()) or type(err).__name__
        raise ConfigError(f"optimizer.params for {kind} are refused by its constructor ({reason}); correct the value "
                          "it names") from None
    common = {k: probe.defaults.get(k, 0.0) for k in _COMMON}
    return dict(params), {k: float(v) for k, v in common.items()}


def _check_value(path: str, default: Any, value: Any) -> None:
    """A number where the constructor's default is one, true/false where it is a flag (torch checks the ranges)."""
    if isinstance(default, bool) and not isinstance(value, bool):
        raise ConfigError(f"{path} must be true or false, got {show(value)}")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, (int, float)) and not isinstance(default, bool) and not (number and math.isfinite(value)):
        raise ConfigError(f"{path} must be a finite number, got {show(value)}")


def build(kind: str, arguments: dict[str, Any], groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The optimizer the config names, over `groups`, with the config's arguments."""
    return optimizer_class(kind)(groups, **arguments)

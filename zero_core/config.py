"""Load a DeepSpeed-style config strictly and resolve it against the world size.

    cfg = load_config("ds_config.json", world_size=8)   # or a dict, or a ZeroConfig
    cfg = load_config(raw, 8, auto={"learning_rate": 3e-5, "per_device_train_batch_size": 4, "bf16": True})
    cfg.train_micro_batch_size_per_gpu, cfg.optimizer.params.lr, cfg.zero_optimization.reduce_bucket_size

DeepSpeed silently ignores a misspelled key; we never do. Every problem of a config (unknown keys, bad
values, contradictions, "auto" values nobody filled, values that contradict `auto`) is reported at once,
in one ConfigError line (config_errors.py, config_checks.py). A config file is read by config_file.py, the
batch sizes are resolved by config_batch.py. "auto" is filled as Hugging Face's Trainer fills it, from `auto`
(config_auto.py). Keys zero_core accepts without acting on them are named once on rank 0 (config_keys.py).
Without an "optimizer" section the optimizer is AdamW with lr 1e-3 (DeepSpeed would need a client optimizer);
without "scheduler" the lr is constant. The legacy top-level "bfloat16" key is read as "bf16", as DeepSpeed does.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from .config_auto import AutoValues, resolve_auto
from .config_batch import resolve_batch
from .config_checks import contradictions
from .config_errors import ConfigError, Problem, UnsupportedFeature, combined, every_error
from .config_file import read_config_file
from .config_keys import not_acted_on
from .config_models import ZeroConfig

__all__ = ["ConfigError", "ZeroConfig", "AutoValues", "load_config", "resolve_config", "describe", "resolve_batch"]

_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_PASSES = 10  # validation passes, each leaving out what the previous one found bad


class Resolved(NamedTuple):
    config: ZeroConfig
    raw: Any  # the config as given with its "auto" values filled (batch sizes left to derive are left out)
    filled: list[tuple[str, Any, tuple[str, ...]]]  # (dotted key, value, the auto fields it came from; () = a default)


def load_config(
    config: dict | str | os.PathLike | ZeroConfig,
    world_size: int,
    *,
    auto: AutoValues | Mapping[str, Any] | None = None,
) -> ZeroConfig:
    """Validate `config`, fill its "auto" values from `auto` and resolve its batch sizes for `world_size` ranks.

    `auto`: what a trainer knows (an AutoValues or a dict of its fields, e.g. {"learning_rate": 3e-5});
    its world_size defaults to `world_size`. Rank 0 then names, once, the keys set that are not acted on.
    """
    cfg = resolve_config(config, world_size, auto=auto).config
    _name_keys_not_acted_on(cfg)
    return cfg


def resolve_config(
    config: dict | str | os.PathLike | ZeroConfig,
    world_size: int,
    *,
    auto: AutoValues | Mapping[str, Any] | None = None,
    defaults: AutoValues | Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Resolved:
    """load_config's work without the rank-0 line, also returning what was filled. `defaults` and `labels`
    are resolve_auto's: values that only fill "auto" (a command line's default flags), names for messages."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    values = AutoValues.of(auto)
    if values.world_size is None:
        values = dataclasses.replace(values, world_size=world_size)
    elif values.world_size != world_size:
        raise ConfigError(f"auto world_size {values.world_size} differs from the world size {world_size}; drop one")
    raw, given = _raw(config)
    _check_depth(raw)
    filled = resolve_auto(raw, values, defaults=defaults, labels=labels)
    cfg, messages, left_out = _validate(_unfilled_auto_dropped(filled.config))
    left_out += [key for p in filled.problems for key in p.keys]
    problems = messages + [p.message for p in filled.problems]
    resolved = None
    if cfg is not None:
        checks = contradictions(cfg)
        if given is None:
            given = tuple(getattr(cfg, k) for k in _BATCH)
        try:
            resolved = resolve_batch(*given, world_size=world_size)
        except ConfigError as e:
            checks.append(Problem(_BATCH, str(e)))
        kept = [p for p in checks if not _touches(p.keys, left_out)]
        problems += [p.message for p in kept]
        if kept and len(kept) == len(problems) and all(p.lacking for p in kept):
            raise UnsupportedFeature(combined(problems))
    if problems or cfg is None or resolved is None:
        raise ConfigError(combined(problems))
    out = cfg.model_copy(update=dict(zip(_BATCH, resolved)))
    out._given_batch = given
    return Resolved(out, filled.config, filled.filled)


def _validate(raw: Any) -> tuple[ZeroConfig | None, list[str], list[str]]:
    """(the config, or None if some of it could not be checked; every error message; the keys left out).

    Each pass leaves out the keys (or sections) pydantic found bad, so that the next pass finds the rest,
    such as errors hidden behind a model validator, and the last one yields a config to cross-check."""
    messages: list[str] = []
    left_out: list[str] = []
    data = raw
    for _ in range(_PASSES):
        try:
            return ZeroConfig.model_validate(data), messages, left_out
        except ValidationError as err:
            found = every_error(err, ZeroConfig)
        # a key a pass left out for being bad is not also "required" in the next one
        messages += [m for m, _ in found if m and not any(m.startswith(f"{key} is required;") for key in left_out)]
        data = copy.deepcopy(data)
        dropped = [loc for _, loc in found if loc is not None and _drop(data, loc)]
        if not dropped:
            break
        left_out += [".".join(str(part) for part in loc) for loc in dropped]
    return None, messages, left_out


def _drop(data: Any, loc: tuple[Any, ...]) -> bool:
    for part in loc[:-1]:
        data = data.get(part) if isinstance(data, dict) else None
    if isinstance(data, dict) and loc[-1] in data:
        del data[loc[-1]]
        return True
    return False


def _touches(keys: tuple[str, ...], left_out: list[str]) -> bool:
    """Whether a problem involves a key that was itself bad (its message would be about a stand-in default)."""
    return any(k == d or k.startswith(d + ".") or d.startswith(k + ".") for k in keys for d in left_out)


_NAMED: set[str] = set()  # the lines already printed by this process


def _name_keys_not_acted_on(cfg: ZeroConfig) -> None:
    """Rank 0 names, once per process, the keys the config sets that zero_core accepts without acting on."""
    rows = not_acted_on(set_keys(cfg))
    notes = (cfg._deprecated_form, cfg.zero_optimization._deprecated_form)  # deprecated forms read
    lines = [f"zero_core: {note}" for note in notes if note]
    lines += ["zero_core: accepted, not acted on: " + ", ".join(f"{k.path} ({k.why})" for k in rows)] if rows else []
    for line in lines if _rank() == 0 else []:
        if line not in _NAMED:
            _NAMED.add(line)
            print(line, file=sys.stderr, flush=True)


def set_keys(model: BaseModel, prefix: str = "") -> list[str]:
    """The dotted keys a config sets (sections recursed into), in the models' field order."""
    out = []
    for name in type(model).model_fields:
        if name in model.model_fields_set:
            value = getattr(model, name)
            out += set_keys(value, f"{prefix}{name}.") if isinstance(value, BaseModel) else [prefix + name]
    return out


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def describe(cfg: ZeroConfig) -> str:
    """The resolved config as pretty JSON (top-level keys at null, which is their default, left out)."""
    fields = type(cfg).model_fields
    data = {k: v for k, v in cfg.model_dump(mode="json").items() if v is not None or fields[k].default is not None}
    return json.dumps(data, indent=2)


def _raw(config: Any) -> tuple[Any, tuple[int | None, ...] | None]:
    """The config as plain data, plus the batch sizes a ZeroConfig was originally given."""
    if isinstance(config, ZeroConfig):
        data = config.model_dump(exclude_unset=True)  # what the user set, so that only that is named
        given = config._given_batch
        if all(v is None for v in given):  # built directly, not by load_config
            given = tuple(getattr(config, k) for k in _BATCH)
        return data, given
    if isinstance(config, (str, os.PathLike)):
        return read_config_file(os.fspath(config)), None
    if isinstance(config, Mapping):
        return dict(config), None
    raise ConfigError(f"config must be a dict, a path to a JSON file or a ZeroConfig, got {type(config).__name__}")


# the sections DeepSpeed reads with its config models, which drop an "auto" no trainer filled, so the key takes
# DeepSpeed's default (HF configs write "auto" under keys nothing fills, e.g. overlap_comm); offload ratio "auto"
# is zero_core's own (the largest device share that fits)
_DEEPSPEED_MODELS = (("fp16",), ("bf16",), ("bfloat16",), ("zero_optimization",),
                     ("zero_optimization", "offload_optimizer"), ("zero_optimization", "offload_param"))
_OWN_AUTO = {("zero_optimization", "offload_optimizer"): {"ratio"}}


def _unfilled_auto_dropped(config: Any) -> Any:
    if not isinstance(config, dict):
        return config
    out = copy.deepcopy(config)
    for path in _DEEPSPEED_MODELS:
        section: Any = out
        for part in path:
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict):
            keep = _OWN_AUTO.get(path, set())
            for key in [k for k, v in section.items() if isinstance(v, str) and v == "auto" and k not in keep]:
                del section[key]
    return out


MAX_CONFIG_DEPTH = 64  # DeepSpeed's own sections nest 3 levels; deeper is a crafted file, and Python's stack ends


def _check_depth(raw: Any) -> None:
    """Refuse a config nested past MAX_CONFIG_DEPTH in one line (copying or printing it would overflow the stack)."""
    stack = [(raw, 0, "")]
    while stack:  # iterative: the walk itself must not recurse
        node, depth, where = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"config is nested more than {MAX_CONFIG_DEPTH} levels deep (at {where[:60]}...); "
                              "DeepSpeed configs nest a few levels: flatten it")
        if isinstance(node, Mapping):
            stack += [(v, depth + 1, f"{where}.{k}" if where else str(k)) for k, v in node.items()]
        elif isinstance(node, (list, tuple)):
            stack += [(v, depth + 1, f"{where}[{i}]") for i, v in enumerate(node)]

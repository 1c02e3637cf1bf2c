"""Load a DeepSpeed-style config strictly and resolve it against the world size.

    cfg = load_config("ds_config.json", world_size=8)   # or a dict, or a ZeroConfig
    cfg.train_micro_batch_size_per_gpu, cfg.optimizer.params.lr, cfg.zero_optimization.reduce_bucket_size

DeepSpeed silently ignores a misspelled key; we never do (see config_errors.py). DeepSpeed keys that
zero_core lacks (amp, pipeline, activation_checkpointing, ...) are errors that say so; the logging
sections (tensorboard, wandb, csv_monitor, comet, flops_profiler, comms_logger) are carried, unused.
Without an "optimizer" section the optimizer is AdamW with lr 1e-3 (DeepSpeed would need a client
optimizer); without "scheduler" the lr is constant. What "auto" resolves to without a trainer (HF
fills these from its own arguments; `fill_auto=` lets a runner do the same):
  - batch sizes, gradient_accumulation_steps: "not given"; the missing ones are derived as DeepSpeed does
  - gradient_clipping: 1.0 (HF's max_grad_norm default)
  - fp16.enabled / bf16.enabled: false
  - optimizer.params betas / eps / weight_decay: (0.9, 0.999) / 1e-8 / 0.0 (HF's and FusedAdam's defaults)
  - scheduler.params.warmup_min_lr: 0; warmup_max_lr: optimizer.params.lr
  - bucket sizes and other element counts: DeepSpeed's defaults
  - optimizer.params.lr, warmup_num_steps, total_num_steps: an error asking for a number
The legacy top-level "bfloat16" key is read as "bf16", as DeepSpeed does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from .config_errors import ConfigError, from_validation_error
from .config_models import SCHEDULER_KEYS, ZeroConfig

__all__ = ["ConfigError", "ZeroConfig", "load_config", "describe", "resolve_batch"]

_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def load_config(config: dict | str | os.PathLike | ZeroConfig, world_size: int, *,
                fill_auto: Mapping[str, Any] | None = None) -> ZeroConfig:
    """Validate `config` and resolve its batch sizes for `world_size` ranks.

    `fill_auto` maps dotted keys (e.g. "optimizer.params.lr") to values that replace an "auto" there,
    the way HF's Trainer fills DeepSpeed configs; keys that are absent or not "auto" are left alone.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    raw, given = _raw(config)
    for key, value in (fill_auto or {}).items():
        raw = _replace_auto(raw, key.split("."), value)
    raw = _warmup_max_lr_from_optimizer(raw)
    try:
        cfg = ZeroConfig.model_validate(raw)
    except ValidationError as err:
        raise from_validation_error(err, ZeroConfig) from None
    _check_consistency(cfg)
    if given is None:
        given = tuple(getattr(cfg, k) for k in _BATCH)
    resolved = resolve_batch(*given, world_size=world_size)
    out = cfg.model_copy(update=dict(zip(_BATCH, resolved)))
    out._given_batch = given
    return out


def describe(cfg: ZeroConfig) -> str:
    """The resolved config as pretty JSON (unset logging sections left out)."""
    data = cfg.model_dump(mode="json")
    for key in ("tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger", "aio"):
        if data.get(key) is None:
            data.pop(key, None)
    return json.dumps(data, indent=2)


def resolve_batch(train: int | None, micro: int | None, gas: int | None, *, world_size: int) -> tuple[int, int, int]:
    """DeepSpeed's rule: train_batch_size = micro * gas * world_size; any two give the third.

    Only one of train/micro given means gas = 1; None means absent (or "auto").
    """
    ws = world_size
    if train is None and micro is None:
        if gas is not None:
            raise ConfigError("gradient_accumulation_steps alone does not fix the batch size; "
                              "also set train_micro_batch_size_per_gpu or train_batch_size")
        raise ConfigError("no batch size: set train_micro_batch_size_per_gpu (per GPU) or train_batch_size (global) "
                          "to a number ('auto' needs a trainer to fill it in)")
    if train is None:
        gas = 1 if gas is None else gas
        return micro * gas * ws, micro, gas
    if micro is None:
        gas = 1 if gas is None else gas
        _divisible(train, [("gradient_accumulation_steps", gas), ("world_size", ws)], "train_micro_batch_size_per_gpu")
        return train, train // (gas * ws), gas
    if gas is None:
        _divisible(train, [("train_micro_batch_size_per_gpu", micro), ("world_size", ws)], "gradient_accumulation_steps")
        return train, micro, train // (micro * ws)
    if train != micro * gas * ws:
        raise ConfigError(f"train_batch_size ({train}) must equal train_micro_batch_size_per_gpu * "
                          f"gradient_accumulation_steps * world_size = {micro} * {gas} * {ws} = {micro * gas * ws}; "
                          "fix one of them, or leave one out (or 'auto') to derive it")
    return train, micro, gas


def _divisible(train: int, factors: list[tuple[str, int]], derived: str) -> None:
    names = " * ".join(n for n, _ in factors)
    values = " * ".join(str(v) for _, v in factors)
    product = 1
    for _, v in factors:
        product *= v
    if train % product:
        raise ConfigError(f"train_batch_size ({train}) is not divisible by {names} = {values} = {product}, "
                          f"so {derived} cannot be derived; make train_batch_size a multiple of {product}")


def _raw(config: Any) -> tuple[Any, tuple[int | None, ...] | None]:
    """The config as plain data, plus the batch sizes a ZeroConfig was originally given."""
    if isinstance(config, ZeroConfig):
        data = config.model_dump()
        given = config._given_batch
        if all(v is None for v in given):  # built directly, not by load_config
            given = tuple(data[k] for k in _BATCH)
        return data, given
    if isinstance(config, (str, os.PathLike)):
        return read_config_file(os.fspath(config)), None
    if isinstance(config, Mapping):
        return dict(config), None
    raise ConfigError(f"config must be a dict, a path to a JSON file or a ZeroConfig, got {type(config).__name__}")


def read_config_file(path: str) -> Any:
    """Parse a DeepSpeed-style JSON file, refusing duplicate keys (json.load silently keeps the last)."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError(f"config file '{path}' has the key '{key}' twice in one object; keep one")
            out[key] = value
        return out

    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, object_pairs_hook=no_duplicates)
    except FileNotFoundError:
        raise ConfigError(f"config file '{path}' does not exist; pass the path of a DeepSpeed-style JSON file") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"config file '{path}' is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}; "
                          "fix the syntax (double quotes, no trailing commas, no comments)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file '{path}': {e}; pass a readable UTF-8 JSON file") from None


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def _replace_auto(data: Any, path: list[str], value: Any) -> Any:
    """`data` with the "auto" at `path` replaced by `value` (a copy along the path; no mutation)."""
    if not isinstance(data, dict) or path[0] not in data:
        return data
    head, rest = path[0], path[1:]
    if rest:
        return {**data, head: _replace_auto(data[head], rest, value)}
    return {**data, head: value} if _is_auto(data[head]) else data


def _warmup_max_lr_from_optimizer(raw: Any) -> Any:
    """scheduler.params.warmup_max_lr "auto" means the optimizer's lr (HF sets both from --learning_rate)."""
    sched = raw.get("scheduler") if isinstance(raw, dict) else None
    params = sched.get("params") if isinstance(sched, dict) else None
    if not isinstance(params, dict) or not _is_auto(params.get("warmup_max_lr")):
        return raw
    opt = raw.get("optimizer", {})
    opt_params = opt.get("params", {}) if isinstance(opt, dict) else None
    lr = opt_params.get("lr", 1e-3) if isinstance(opt_params, dict) else None
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        return raw  # the field validator then asks for a number
    return _replace_auto(raw, ["scheduler", "params", "warmup_max_lr"], lr)


def _check_consistency(cfg: ZeroConfig) -> None:
    """Contradictions between fields; each message names the keys and the fix."""
    if cfg.fp16.enabled and cfg.bf16.enabled:
        raise ConfigError("fp16.enabled and bf16.enabled are both true; enable only one of them")
    opt = cfg.optimizer
    if opt.type == "AdamW" and "adam_w_mode" in opt.params.model_fields_set and not opt.params.adam_w_mode:
        raise ConfigError("optimizer.params.adam_w_mode=false has no effect with optimizer.type 'AdamW' "
                          "(DeepSpeed ignores it too); use type 'Adam' for L2-style weight decay or remove it")
    if cfg.scheduler is not None:
        kind, p = cfg.scheduler.type, cfg.scheduler.params
        stray = sorted(p.model_fields_set - SCHEDULER_KEYS[kind])
        if stray:
            users = [k for k, keys in SCHEDULER_KEYS.items() if stray[0] in keys]
            raise ConfigError(f"scheduler.params.{stray[0]} does not apply to {kind} (it is a parameter of "
                              f"{' and '.join(users)}); remove it or change scheduler.type")
        if kind in ("WarmupDecayLR", "WarmupCosineLR") and p.total_num_steps is None:
            raise ConfigError(f"scheduler.params.total_num_steps is required for {kind}; "
                              "set it to the number of optimizer steps of the run")
        if kind == "OneCycle" and (p.cycle_min_lr is None or p.cycle_max_lr is None):
            raise ConfigError("scheduler.params.cycle_min_lr and cycle_max_lr are required for OneCycle; set both")
    zero = cfg.zero_optimization
    if zero.offload_param is not None and zero.offload_param.device != "none" and zero.stage < 3:
        raise ConfigError(f"zero_optimization.offload_param needs stage 3 but zero_optimization.stage is {zero.stage}; "
                          "remove offload_param or set the stage to 3")
    if zero.offload_param is not None and zero.offload_param.device == "nvme":
        raise ConfigError("zero_optimization.offload_param.device='nvme' is not supported yet (optimizer states can "
                          "go to NVMe: offload_optimizer.device='nvme'); use 'cpu' or 'none'")
    off = zero.offload_optimizer
    if off is not None and off.device != "none" and zero.stage == 0:
        raise ConfigError("zero_optimization.offload_optimizer needs stage 1, 2 or 3 but zero_optimization.stage is 0; "
                          "set the stage to 1-3 or the offload device to 'none'")
    if off is not None and off.ratio != 1.0 and off.device != "none":
        raise ConfigError(f"zero_optimization.offload_optimizer.ratio={off.ratio} (offloading only part of the optimizer) "
                          "is not supported yet; remove it or set 1.0")
    if off is not None and off.device == "nvme":
        if not off.nvme_path:
            raise ConfigError("zero_optimization.offload_optimizer.nvme_path is required with device 'nvme'; "
                              "set it to a directory on a fast local disk")
        if off.buffer_count < 2:
            raise ConfigError(f"zero_optimization.offload_optimizer.buffer_count={off.buffer_count} is too small for "
                              "NVMe offload: one chunk is updated while the next is read; set 2 or more (4 is the default)")
    _check_aio(cfg)


# libaio submission settings that a thread pool has no use for: accepted at DeepSpeed's defaults only
_AIO_DEFAULT_ONLY = {"single_submit": False, "overlap_events": True, "intra_op_parallelism": 1}


def _check_aio(cfg: ZeroConfig) -> None:
    """The aio section (top level, as DeepSpeed reads it, or inside zero_optimization, as HF's docs put it)."""
    top, nested = cfg.aio, cfg.zero_optimization.aio
    if top is not None and nested is not None and top != nested:
        raise ConfigError("aio and zero_optimization.aio are both set and differ; keep one (DeepSpeed reads the top-level one)")
    for where, aio in (("aio", top), ("zero_optimization.aio", nested)):
        if aio is None:
            continue
        if aio.block_size % 4096 or aio.block_size == 0:
            raise ConfigError(f"{where}.block_size={aio.block_size} must be a positive multiple of 4096 "
                              "(NVMe requests are 4 KiB-aligned); 1048576 is DeepSpeed's default")
        if aio.use_gds:
            raise ConfigError(f"{where}.use_gds=true (GPUDirect Storage) is not supported; remove it or set false")
        for key, default in _AIO_DEFAULT_ONLY.items():
            if getattr(aio, key) != default:
                raise ConfigError(f"{where}.{key}={json.dumps(getattr(aio, key))} is a libaio setting zero_core does not "
                                  f"use (its NVMe I/O runs on a thread pool); remove it or set {json.dumps(default)}")

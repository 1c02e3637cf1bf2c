"""Each variant's DeepSpeed-style dict: the one config every engine reads its settings from.

zero and deepspeed variants train with it; ddp and fsdp2 read the same optimizer, schedule, clipping
and precision from it, so a comparison changes only the engine. Built in two steps:

1. `template(scenario, variant)`: the variant's file (ds_config JSON or Accelerate YAML) or nothing,
   plus the scenario's defaults for what the file leaves out; stage and offload from the variant.
2. `finalize(template, ...)`: once the batch size and run length are known, every "auto" is filled
   the way Hugging Face's Trainer fills it (zero_core/config_auto.py: lr, clipping, precision, bucket
   sizes from the hidden size, warm-up steps at least 1).
"""

from __future__ import annotations

import copy
import os
from typing import Any

from zero_core import AutoValues, ConfigError, fill_auto
from zero_core.config import read_config_file
from zero_core.config_auto import is_auto
from zero_core.config_errors import show

from .accelerate_config import load_accelerate_config
from .bounds import MAX_BATCH
from .limits import check_count
from .plan_inputs import abs_path  # ~ and relative paths, as the data paths
from .scenario import Scenario, VariantSpec


def _read_json(path: str) -> dict[str, Any]:
    data = read_config_file(path)  # zero_core's reader: the same messages, and duplicate keys refused
    if not isinstance(data, dict):
        raise ConfigError(
            f"ds_config {path} must hold a JSON object {{...}}; write its settings as one {{...}} mapping"
        )
    return data


def template(sc: Scenario, v: VariantSpec, base_dir: str) -> dict[str, Any]:
    """The variant's config with the scenario's defaults; "auto" values stay for `finalize`. ConfigError (the
    caller names the variant) for what would fail or be misread in the ranks: a micro-batch, stage or offload
    section of the wrong type."""
    if v.ds_config:
        ds = _read_json(abs_path(v.ds_config, base_dir))
    elif v.accelerate_config:
        ds = load_accelerate_config(abs_path(v.accelerate_config, base_dir))
    else:
        ds = {}
    ds = copy.deepcopy(ds)
    micro = ds.setdefault("train_micro_batch_size_per_gpu", "auto")
    if not is_auto(micro) and check_count(micro, 1, MAX_BATCH):  # it becomes the variant's batch, unsearched
        raise ConfigError(f'train_micro_batch_size_per_gpu must be "auto" or a whole number from 1 to {MAX_BATCH:,} '
                          f"(the range of the scenario's batch_size), got {show(micro)}; fix the config file")
    ds.setdefault("gradient_accumulation_steps", sc.grad_accum)
    ds.setdefault("gradient_clipping", sc.max_grad_norm)
    ours_optimizer = "optimizer" not in ds  # the scenario's AdamW, as a training script would pass it
    ds.setdefault(
        "optimizer",
        {"type": "AdamW", "params": {"lr": sc.lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": sc.weight_decay}},
    )
    if sc.warmup_steps and "scheduler" not in ds:
        ds["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": sc.lr,
                "warmup_num_steps": sc.warmup_steps,
                "warmup_type": "linear",
            },
        }
    if sc.precision != "fp32":
        ds.setdefault(sc.precision, {"enabled": True})
    zero = ds.setdefault("zero_optimization", {})
    if not isinstance(zero, dict):
        raise ConfigError(f"zero_optimization must be an object {{...}}, got {show(zero)}; fix the config file")
    if v.engine in ("zero", "deepspeed"):
        if v.stage is not None:
            if "stage" in zero and zero["stage"] != v.stage:
                raise ConfigError(
                    f"stage {v.stage} but its config file says zero_optimization.stage {show(zero['stage'])}; "
                    "remove one of them"
                )
            zero["stage"] = v.stage
        zero.setdefault("stage", 2)
        if check_count(zero["stage"], 0, 3):  # every engine and the row read it as a number
            unfilled = " (nothing fills \"auto\" for a stage)" if is_auto(zero["stage"]) else ""
            raise ConfigError(
                f"zero_optimization.stage must be 0, 1, 2 or 3, got {show(zero['stage'])}{unfilled}; set it in the "
                "config file or give the variant stage: N"
            )
        for part in ("optimizer", "param"):
            key = f"offload_{part}"
            if zero.get(key) is not None and not isinstance(zero[key], dict):
                raise ConfigError(
                    f'zero_optimization.{key} must be an object such as {{"device": "cpu"}}, got '
                    f"{show(zero[key])}; fix the config file"
                )
            device = getattr(v, key)
            if device is not None:
                section = zero.setdefault(key, {})
                if section is None:
                    section = zero[key] = {}
                section["device"] = device
        if v.nvme_path is not None:  # the folder of every section offloaded to NVMe
            path = os.path.expanduser(v.nvme_path)
            for part in ("optimizer", "param"):
                if getattr(v, f"offload_{part}") == "nvme":
                    zero[f"offload_{part}"]["nvme_path"] = path if os.path.isabs(path) else os.path.join(base_dir, path)
        if v.engine == "deepspeed" and ours_optimizer and not has_offload(ds):
            # a config without an optimizer section means the script's torch AdamW (as with Accelerate);
            # DeepSpeed's default FusedAdam would be compiled on first use (needs nvcc and a matching arch list)
            ds["optimizer"]["params"].setdefault("torch_adam", True)
    else:
        zero["stage"] = 0  # ddp/fsdp2 use only the optimizer/precision settings
    _check_precision(ds, sc, v)
    return ds


def _check_precision(ds: dict[str, Any], sc: Scenario, v: VariantSpec) -> None:
    """An explicit fp16/bf16 switch in a file must agree with the scenario's precision."""
    for key in ("fp16", "bf16"):
        enabled = ds.get(key, {}).get("enabled") if isinstance(ds.get(key), dict) else None
        on = enabled is True or (isinstance(enabled, str) and enabled.strip().lower() == "true")
        if on and sc.precision != key:
            raise ConfigError(
                f"its config enables {key} but the scenario's precision is "
                f"{sc.precision}; set precision: {key} in the scenario or turn {key} off in the file"
            )


def finalize(
    ds: dict[str, Any], *, sc: Scenario, batch: int, world_size: int, total_steps: int, hidden: int
) -> dict[str, Any]:
    """`ds` with the batch size set and every "auto" filled (a copy), by zero_core's resolver."""
    out = copy.deepcopy(ds)
    out["train_micro_batch_size_per_gpu"] = batch
    gas = out.get("gradient_accumulation_steps")
    gas = sc.grad_accum if gas is None or is_auto(gas) else gas
    out["gradient_accumulation_steps"] = gas
    if "train_batch_size" in out:
        out["train_batch_size"] = batch * gas * world_size  # follows the batch the runner picked
    # the scenario's values fill "auto" only: an explicit value in the variant's file is its own choice
    scenario = AutoValues(
        world_size=world_size,
        max_grad_norm=sc.max_grad_norm,
        learning_rate=sc.lr,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=sc.weight_decay,
        fp16=sc.precision == "fp16",
        bf16=sc.precision == "bf16",
        hidden_size=hidden,
        max_steps=total_steps,
        warmup_steps=sc.warmup_steps,
    )
    return fill_auto(out, defaults=scenario)[0]


def has_offload(ds: dict[str, Any]) -> bool:
    zero = ds.get("zero_optimization") or {}
    return any(
        isinstance(zero.get(k), dict) and zero[k].get("device", "none") != "none"
        for k in ("offload_optimizer", "offload_param")
    )


def make_nvme_folders(ds: dict[str, Any], variant: str) -> None:
    """Create the NVMe offload folders a scenario names (scratch space, as DeepSpeed creates its swap folders);
    nothing in them is ever removed but the engine's own files. ConfigError if one cannot be made."""
    zero = ds.get("zero_optimization") or {}
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key)
        if isinstance(section, dict) and section.get("device") == "nvme" and isinstance(section.get("nvme_path"), str):
            try:
                os.makedirs(section["nvme_path"], exist_ok=True)
            except OSError as e:
                raise ConfigError(
                    f"variant '{variant}': nvme_path '{section['nvme_path']}' cannot be created ({e.strerror}); "
                    "create it or give the variant a folder on a local disk"
                ) from None


def fixed_batch(ds: dict[str, Any]) -> int | None:
    """The train_micro_batch_size_per_gpu of the variant's own file, if it sets one (`template` checked it)."""
    micro = ds.get("train_micro_batch_size_per_gpu")
    return None if micro is None or is_auto(micro) else micro

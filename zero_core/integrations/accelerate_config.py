"""The DeepSpeed config zero_core's Accelerator builds its engine from: the plugin's, less Accelerate's
placeholders, with the values Accelerate's DeepSpeed path fills from `DummyOptim`/`DummyScheduler`, and its
pairing of the code's optimizer and scheduler with the config's sections."""

from __future__ import annotations

import math
from typing import Any

import torch
from accelerate.utils import DeepSpeedPlugin
from accelerate.utils.deepspeed import DummyOptim, DummyScheduler  # not re-exported without DeepSpeed

from ..config_auto import is_auto
from .accelerate_schedules import is_deepspeed_schedule


def plugin_config(plugin: DeepSpeedPlugin) -> dict[str, Any]:
    """The plugin's DeepSpeed config, less Accelerate's placeholders zero_core does not read."""
    config = dict(plugin.deepspeed_config)
    if isinstance(config.get("steps_per_print"), float) and not math.isfinite(config["steps_per_print"]):
        del config["steps_per_print"]
    zero = config.get("zero_optimization", {})
    for key in ("offload_optimizer", "offload_param"):
        if isinstance(zero.get(key), dict) and zero[key].get("device") == "none":
            del zero[key]
    return config


def dummy_values(optimizer: Any, scheduler: Any, processes: int, split_batches: bool) -> dict[str, Any]:
    """What Accelerate's DeepSpeed path fills from `DummyOptim` and `DummyScheduler` (dotted config keys)."""
    out: dict[str, Any] = {}
    if isinstance(optimizer, DummyOptim):
        out |= {"optimizer.params.lr": optimizer.lr, "optimizer.params.weight_decay": optimizer.weight_decay}
    if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is None:
        inner = scheduler.optimizer
        max_lr = inner.defaults["lr"] if getattr(inner, "defaults", None) is not None else getattr(inner, "lr", None)
        out |= {"scheduler.params.warmup_min_lr": 0, "scheduler.params.warmup_max_lr": max_lr,
                "scheduler.params.warmup_num_steps": max(1, scheduler.warmup_num_steps)}  # DeepSpeed refuses 0
        if scheduler.total_num_steps is not None:  # counted in batches of every process, unless split
            total = scheduler.total_num_steps
            out["scheduler.params.total_num_steps"] = total if split_batches else math.ceil(total / processes)
    return out


def check_against_config(config: dict[str, Any], optimizer: Any, scheduler: Any) -> None:
    """Accelerate's DeepSpeed pairing of the code's optimizer and scheduler with the config's sections."""
    if isinstance(optimizer, DummyOptim) and "optimizer" not in config:  # its lr and weight decay would be lost
        raise ValueError(
            "DummyOptim needs an 'optimizer' section in the DeepSpeed config; add one or pass a torch optimizer"
        )
    if isinstance(optimizer, torch.optim.Optimizer) and "optimizer" in config:
        raise ValueError(
            "prepare() got a torch optimizer and the DeepSpeed config has its own 'optimizer' section; drop one, or "
            "pass DummyOptim to train with the config's"
        )
    if isinstance(scheduler, DummyScheduler) and "scheduler" not in config and scheduler.lr_scheduler_callable is None:
        raise ValueError(
            "DummyScheduler needs a 'scheduler' section in the DeepSpeed config (or its lr_scheduler_callable); add "
            "one or pass a torch scheduler"
        )
    if (isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) or is_deepspeed_schedule(scheduler)) and (
        "scheduler" in config
    ):
        raise ValueError(
            "prepare() got a torch scheduler and the DeepSpeed config has its own 'scheduler' section; drop one, or "
            "pass DummyScheduler to train with the config's"
        )


def fill_auto_only(raw: dict[str, Any], values: dict[str, Any]) -> None:
    """Each dotted key's value where `raw` says "auto" (an explicit value wins, as Accelerate's must_match=False)."""
    for dotted, value in values.items():
        *path, name = dotted.split(".")
        section: Any = raw
        for part in path:
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict) and isinstance(section.get(name), str) and section[name] == "auto":
            section[name] = value


def with_mixed_precision(config: dict[str, Any], mixed_precision: str) -> dict[str, Any]:
    """The config with the Accelerator's `mixed_precision` applied as Accelerate's DeepSpeed path applies it
    (DeepSpeedPlugin.set_mixed_precision): a missing fp16/bf16 section is added for it, "auto" `enabled` values follow
    it, an explicit value is kept, and the other dtype's explicit `enabled: true` is refused."""
    out = dict(config)
    wanted = {"fp16": mixed_precision == "fp16", "bf16": mixed_precision in ("bf16", "fp8")}
    if mixed_precision != "no":
        other = "bf16" if mixed_precision == "fp16" else "fp16"
        section = out.get(other)
        if isinstance(section, dict) and str(section.get("enabled", False)).lower() == "true":
            raise ValueError(
                f"mixed_precision='{mixed_precision}' and the DeepSpeed config's {other}.enabled true disagree; "
                f"drop one, or set mixed_precision='{other}'"
            )
    if wanted["fp16"] and "fp16" not in out:
        out["fp16"] = {"enabled": True, "auto_cast": True}  # what Accelerate adds for fp16
    if wanted["bf16"] and "bf16" not in out:
        out["bf16"] = {"enabled": True}
    for dtype, enabled in wanted.items():
        section = out.setdefault(dtype, {"enabled": False})  # a plain run stays in fp32, as DeepSpeed's
        if isinstance(section, dict) and is_auto(section.get("enabled")):
            out[dtype] = {**section, "enabled": enabled}
    return out

"""`zbench train --config FILE`: the flags beside a DeepSpeed config fill its "auto" values, as HF's Trainer does.

Flags the user typed follow HF's fill_match: they fill "auto", an explicit config value that differs
is an error naming both, and a key the config lacks is added (the flag applies). Flags left at their
defaults fill nothing, except those that describe the run itself (--gpus, --steps, --warmup, --model),
which fill "auto" only. Every filled value is printed once, with the flag it came from.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from zero_core import ConfigError
from zero_core.config import read_config_file, resolve_config

# each AutoValues field and the flag that gives it
FLAGS = {"per_device_train_batch_size": "--micro-batch", "gradient_accumulation_steps": "--grad-accum",
         "learning_rate": "--lr", "fp16": "--precision", "bf16": "--precision", "world_size": "--gpus",
         "max_steps": "--steps + --warmup", "warmup_steps": "--warmup", "hidden_size": "--model"}


@dataclass(frozen=True)
class TrainFlags:
    gpus: int
    stage: int
    steps: int
    micro_batch: int
    grad_accum: int
    precision: str
    lr: float
    warmup: int
    preset: str
    hidden: int
    typed: frozenset[str]  # the flags given on the command line (click parameter names)


def config_from_flags(path: str, flags: TrainFlags) -> tuple[dict, list[str]]:
    """(the config with its "auto" values filled, the lines saying what was filled); ConfigError otherwise."""
    yaml_file = ConfigError(f"--config {path} is not valid JSON (YAML, such as an `accelerate config` file?); pass "
                            "the DeepSpeed JSON file, or run the Accelerate config as a scenario variant's "
                            "accelerate_config")
    try:
        raw = read_config_file(path)
    except ConfigError as e:
        if path.lower().endswith((".yaml", ".yml")) and "not valid JSON" in str(e):
            raise yaml_file from None
        raise
    if isinstance(raw, dict) and {"compute_environment", "distributed_type"} & raw.keys():  # hjson reads its lines
        raise yaml_file
    if not isinstance(raw, dict):
        resolve_config(path, flags.gpus)  # raises the reader's own message for a file that holds no object
    added: list[tuple[str, Any, str]] = []
    raw = _add_absent(copy.deepcopy(raw), flags, added)
    told, facts = _values(flags)
    labels = {field: _label(field, flags) for field in FLAGS}
    resolved = resolve_config(raw, flags.gpus, auto=told, defaults=facts, labels=labels)
    from_flags = [f"{key} = {_shown(value)} ({flag})" for key, value, flag in added]
    from_flags += [f"{key} = {_shown(value)} ({', '.join(dict.fromkeys(labels[f] for f in fields))})"
                   for key, value, fields in resolved.filled if fields]
    defaults = [f"{key} = {_shown(value)}" for key, value, fields in resolved.filled if not fields]
    lines = [f"filled from flags: {', '.join(from_flags)}"] if from_flags else []
    lines += [f"filled with defaults: {', '.join(defaults)}"] if defaults else []
    return resolved.raw, lines


def _values(f: TrainFlags) -> tuple[dict, dict]:
    """(the values the user gave, matched against the config; the run's facts at their defaults, fill only)."""
    told: dict[str, Any] = {"world_size": f.gpus}
    facts: dict[str, Any] = {"hidden_size": f.hidden}
    if "micro_batch" in f.typed:
        told["per_device_train_batch_size"] = f.micro_batch
    if "grad_accum" in f.typed:
        told["gradient_accumulation_steps"] = f.grad_accum
    if "lr" in f.typed:
        told["learning_rate"] = f.lr
    if "precision" in f.typed:
        told.update(fp16=f.precision == "fp16", bf16=f.precision == "bf16")
    # optimizer steps of the whole run; each is matched against the config only when a flag that sets it was typed
    (told if {"steps", "warmup"} & f.typed else facts)["max_steps"] = f.steps + f.warmup
    (told if "warmup" in f.typed else facts)["warmup_steps"] = f.warmup
    return told, facts


def _label(field: str, f: TrainFlags) -> str:
    if field in ("fp16", "bf16"):
        return f"--precision {f.precision}" if "precision" in f.typed else "--precision"
    return f"--model {f.preset}" if field == "hidden_size" else FLAGS[field]


def _add_absent(raw: dict, f: TrainFlags, added: list[tuple[str, Any, str]]) -> dict:
    """The keys the typed flags set that the config lacks, added: a typed flag is never dropped."""
    def add(section: dict, name: str, value: Any, key: str, flag: str) -> None:
        if name not in section:
            section[name] = value
            added.append((key, value, flag))

    if "micro_batch" in f.typed:
        add(raw, "train_micro_batch_size_per_gpu", f.micro_batch, "train_micro_batch_size_per_gpu", "--micro-batch")
    if "grad_accum" in f.typed:
        add(raw, "gradient_accumulation_steps", f.grad_accum, "gradient_accumulation_steps", "--grad-accum")
    if "stage" in f.typed:
        zero = _section(raw, "zero_optimization")
        if zero.get("stage", f.stage) != f.stage:
            raise ConfigError(f"--stage {f.stage} contradicts zero_optimization.stage = {zero['stage']} in the config; "
                              "drop --stage or change the config")
        add(zero, "stage", f.stage, "zero_optimization.stage", "--stage")
    if "precision" in f.typed and f.precision != "fp32":
        add(_section(raw, f.precision), "enabled", True, f"{f.precision}.enabled", f"--precision {f.precision}")
    if "lr" in f.typed:
        _add_lr(raw, f.lr, add)
    return raw


def _add_lr(raw: dict, lr: float, add: Any) -> None:
    sched = raw.get("scheduler")
    kind = str(sched.get("type", "")).lower() if isinstance(sched, dict) else ""
    if kind == "onecycle":
        raise ConfigError("--lr does not apply: the config's OneCycle scheduler sets the lr from "
                          "scheduler.params.cycle_min_lr and cycle_max_lr; drop --lr or change those")
    if "optimizer" not in raw:
        raw["optimizer"] = {"type": "AdamW"}  # zero_core's default optimizer, with the lr of --lr
    add(_section(_section(raw, "optimizer"), "params"), "lr", lr, "optimizer.params.lr", "--lr")
    if kind in ("warmuplr", "warmupdecaylr"):  # these warm up to warmup_max_lr, not to the optimizer's lr
        add(_section(sched, "params"), "warmup_max_lr", lr, "scheduler.params.warmup_max_lr", "--lr")


def _section(parent: dict, name: str) -> dict:
    """parent[name] as a dict, created when absent (a non-object is left for the config check to name)."""
    value = parent.setdefault(name, {})
    return value if isinstance(value, dict) else {}


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(list(value)) if isinstance(value, (list, tuple)) else str(value)

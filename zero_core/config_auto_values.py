"""What a trainer knows when it fills a DeepSpeed config's "auto" values (config_auto.py fills them)."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .config_errors import ConfigError, show


@dataclass(frozen=True)
class AutoValues:
    """What the caller knows, named as HF's TrainingArguments (and the model's config) name it; None = unknown."""

    world_size: int | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    max_grad_norm: float | None = None
    learning_rate: float | None = None
    adam_beta1: float | None = None
    adam_beta2: float | None = None
    adam_epsilon: float | None = None
    weight_decay: float | None = None
    fp16: bool | None = None
    bf16: bool | None = None
    hidden_size: int | None = None  # the model's hidden size (config.hidden_size)
    max_steps: int | None = None  # optimizer steps of the whole run (HF: num_training_steps)
    warmup_steps: int | None = None

    def __post_init__(self) -> None:
        bad = [
            f"{name} must be {what}, got {show(getattr(self, name))}"
            for name, (ok, what) in _CHECKS.items()
            if getattr(self, name) is not None and not ok(getattr(self, name))
        ]
        if bad:
            raise ConfigError("auto values: " + "; ".join(bad))

    @classmethod
    def of(cls, values: AutoValues | Mapping[str, Any] | None) -> AutoValues:
        """An AutoValues from itself, a dict of its fields, or None (nothing known)."""
        if values is None:
            return cls()
        if isinstance(values, cls):
            return values
        if not isinstance(values, Mapping):
            raise ConfigError(f"auto must be an AutoValues or a dict of its fields, got {type(values).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in names:
                close = difflib.get_close_matches(str(key), names, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"the fields are {', '.join(names)}"
                raise ConfigError(f"auto has no field {show(key)}; {hint}")
        return cls(**values)

    def known(self, *names: str) -> bool:
        return all(getattr(self, n) is not None for n in names)


def _int(lo: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo), f"an integer >= {lo}"


def _real(ok: Callable[[float], bool], what: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and ok(v)), what


_CHECKS = {
    "world_size": _int(1),
    "per_device_train_batch_size": _int(1),
    "gradient_accumulation_steps": _int(1),
    "max_grad_norm": _real(lambda v: v >= 0, "a number >= 0"),
    "learning_rate": _real(lambda v: v >= 0, "a number >= 0"),
    "adam_beta1": _real(lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "adam_beta2": _real(lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "adam_epsilon": _real(lambda v: v > 0, "a number > 0"),
    "weight_decay": _real(lambda v: v >= 0, "a number >= 0"),
    "fp16": (lambda v: isinstance(v, bool), "true or false"),
    "bf16": (lambda v: isinstance(v, bool), "true or false"),
    "hidden_size": _int(1),
    "max_steps": _int(1),
    "warmup_steps": _int(0),
}

"""Shared by the config tests: the one-line error of a config, and what a trainer would know."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zero_core.config import ConfigError, load_config

SEEDS = Path(__file__).parent / "data" / "seed_configs"
MB = {"train_micro_batch_size_per_gpu": 4}
# what a trainer would know: fills every "auto" of the seed configs
TRAINER = {"per_device_train_batch_size": 2, "learning_rate": 1e-4, "fp16": True, "bf16": False, "hidden_size": 32,
           "max_steps": 20, "warmup_steps": 2}


def error(config: Any, world_size: int = 2, **kw: Any) -> str:
    """The ConfigError message for `config`; it must be exactly one line."""
    with pytest.raises(ConfigError) as info:
        load_config(config, world_size, **kw)
    msg = str(info.value)
    assert "\n" not in msg and msg.strip() == msg and msg
    return msg

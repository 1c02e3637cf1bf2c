"""The DeepSpeed config `accelerate launch` hands a process started from a DEEPSPEED config file: its
`ACCELERATE_USE_DEEPSPEED` and `ACCELERATE_DEEPSPEED_*` variables, read as Accelerate's `DeepSpeedPlugin()` reads
them (the config file they name, or the config built from their fields)."""

from __future__ import annotations

import os
from typing import Any

LAUNCHED = "ACCELERATE_USE_DEEPSPEED"  # "true" in a process `accelerate launch` started for DeepSpeed


def launched_config() -> dict[str, Any] | None:
    """The launcher's DeepSpeed config, or None where no such launcher started this process."""
    if os.environ.get(LAUNCHED, "false").lower() != "true":
        return None
    from accelerate.utils import DeepSpeedPlugin

    from .accelerate_config import plugin_config

    return plugin_config(DeepSpeedPlugin())

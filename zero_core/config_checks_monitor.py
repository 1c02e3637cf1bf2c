"""The monitor sections (csv_monitor, tensorboard, wandb, comet) checked when the config is loaded, as the engine
reads them at its first update: a bad one is an error before any rank starts, not a traceback on rank 0 later."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

from .config_errors import Problem
from .config_models import ZeroConfig

_SECTIONS = ("csv_monitor", "tensorboard", "wandb", "comet")


def monitor_problems(cfg: ZeroConfig) -> Iterator[Problem]:
    from .engine_monitor import check_section  # the engine's own reader: one set of rules

    for name in _SECTIONS:
        try:
            check_section(name, getattr(cfg, name))
        except ValueError as e:
            yield Problem((name,), str(e))
    board = cfg.tensorboard or {}
    if board.get("enabled") is True and importlib.util.find_spec("tensorboard") is None:
        yield Problem(("tensorboard",), "tensorboard.enabled is true but the tensorboard package is not installed; "
                      "pip install tensorboard, or set tensorboard.enabled to false")

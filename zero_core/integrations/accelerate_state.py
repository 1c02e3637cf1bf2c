"""`accelerator.state.deepspeed_plugin` on zero_core's Accelerator: the script's DeepSpeed plugin.

Accelerate runs as plain data parallel under zero_core's Accelerator, and its own state answers `None` there.
Scripts written for Accelerate's DeepSpeed path read the plugin to pick their optimizer and scheduler (Accelerate's
`deepspeed_with_config_support.py` example: `DummyOptim` when `"optimizer" in
accelerator.state.deepspeed_plugin.deepspeed_config`, else a torch optimizer), so this Accelerator's state object
answers with the plugin it was given (or built from what `accelerate launch` exported). Only that one object
answers so: the `AcceleratorState()` Accelerate builds for itself reads the shared state as before, and
`distributed_type` stays what Accelerate runs as.
"""

from __future__ import annotations

from typing import Any


def report_plugin(state: Any, plugin: Any) -> None:
    """Make `state.deepspeed_plugin` answer `plugin` on this state object alone."""
    base = type(state)
    state.__class__ = type(base.__name__, (base,), {"deepspeed_plugin": property(lambda _self: plugin)})

"""A refusal of the user's input that the user's script does not catch ends the program with its one line.

zero_core refuses bad configs, checkpoints and calls with one-line messages that name the fix (ConfigError,
CheckpointError, and ValueError / NotImplementedError / ModuleNotFoundError raised in zero_core's own code).
Uncaught, Python would print them under a traceback of the user's script, Trainer's or Lightning's internals, on
every rank. The hook
prints `Error: <the line>` instead (the exit status stays 1); anything else keeps the hook that was there before.
`ZERO_CORE_TRACEBACK=1` shows the full traceback again. It changes nothing for code that catches the exception.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from checkpoints.source import CheckpointError

from .config_errors import ConfigError

_PACKAGES = tuple(str(Path(__file__).resolve().parents[1] / name) + os.sep for name in ("zero_core", "checkpoints"))
_previous: Any = None


def is_refusal(error: BaseException, tb: TracebackType | None) -> bool:
    """One of zero_core's refusals: its own error types, or a ValueError / NotImplementedError (or the import error
    naming a DeepSpeed module zero_core does not provide) raised in its code."""
    if isinstance(error, (ConfigError, CheckpointError)):
        return True
    if not isinstance(error, (ValueError, NotImplementedError, ModuleNotFoundError)) or tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGES)


def _hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    text = str(error)
    if is_refusal(error, tb) and text and "\n" not in text and os.environ.get("ZERO_CORE_TRACEBACK", "") in ("", "0"):
        print(f"Error: {text}", file=sys.stderr, flush=True)
        return
    (_previous or sys.__excepthook__)(kind, error, tb)


def install() -> None:
    """Put the hook in front of the current sys.excepthook (once)."""
    global _previous
    if sys.excepthook is not _hook:
        _previous, sys.excepthook = sys.excepthook, _hook

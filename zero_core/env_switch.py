"""The engine's on/off environment switches (ZERO_CORE_PIN_THREADS, ZERO_CORE_BREAKDOWN, ZERO_CORE_HUGE_PAGES):
one reading of their words, so every switch accepts the same ones."""

from __future__ import annotations

import os

OFF = ("0", "false", "off", "no")
ON = ("1", "true", "on", "yes")


def env_switch(name: str) -> bool | None:
    """False when `name` is set to an off word, True for an on word, None when unset or anything else ("auto":
    the caller's default)."""
    mode = os.environ.get(name, "").strip().lower()
    return False if mode in OFF else True if mode in ON else None

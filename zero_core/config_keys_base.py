"""The row type of zero_core's key table (config_keys.py), shared with the rows of config_keys_deepspeed.py.

- supported: the engine acts on it (where it applies: stage-3 keys at stage 3, fp16 keys with fp16 on).
- ignored: accepted and not acted on; rank 0 names each one that a config sets, once, in one line.
- refused: a one-line error. `accepts` lists the values that are still accepted because they change
  nothing (DeepSpeed's defaults); set to those, the key is named like an ignored one. A whole section
  (a dict zero_core does not read) may have a `switch`: the key inside it that turns the feature on; the
  section is accepted while every key of that name in it, at any depth, is one of `accepts` (or there is none).
"""

from __future__ import annotations

from typing import Any, NamedTuple

SUPPORTED, IGNORED, REFUSED = "supported", "ignored", "refused"


class Key(NamedTuple):
    path: str  # dotted key; a whole section (the logging ones) is one key
    status: str
    why: str = ""  # for ignored and refused keys: what zero_core does instead, or the fix
    accepts: tuple[Any, ...] = ()  # refused keys: values still accepted (DeepSpeed's defaults, no effect)
    switch: str = ""  # a refused whole section: the key in it that turns it on (`accepts`: its values that don't)


def supported(*paths: str) -> list[Key]:
    return [Key(p, SUPPORTED) for p in paths]


def ignored(why: str, *paths: str) -> list[Key]:
    return [Key(p, IGNORED, why) for p in paths]


def is_accepted(value: Any, accepts: tuple[Any, ...]) -> bool:
    """Whether `value` is one of `accepts`, as JSON compares them (true is not 1, "false" is false)."""
    from .config_types import as_bool

    for ok in accepts:
        if isinstance(ok, bool):
            if as_bool(value) is ok:
                return True
        elif type(value) is type(ok) and value == ok:
            return True
    return False

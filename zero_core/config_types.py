"""Strict leaf types for the config models, and `Section`, the base model of every config section.

No silent coercion: a string is never turned into a number and a bool is never a number. The few
leniencies are DeepSpeed's own: ints are fine where a float is expected, whole floats such as 5e8
are fine for element counts, and "true"/"false" strings are fine for booleans (the seed configs have
`"enabled": "true"`). "auto" never reaches these validators where it means something: config_auto.py
fills it first, so an "auto" left here is a bad value like any other.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator

from .config_errors import leaf_error


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def as_bool(v: Any) -> bool | None:
    """A config boolean as zero_core reads it (true, or the text "true"), None when it is none."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    return None


def boolean(optional: bool = False) -> PlainValidator:
    def check(v: Any) -> bool | None:
        if v is None and optional:
            return None
        value = as_bool(v)
        if value is None:
            raise leaf_error("true or false" + (" or null" if optional else ""), v)
        return value

    return PlainValidator(check)


def integer(
    lo: int | None = None, hi: int | None = None, *, counts: bool = False, optional: bool = False,
    infinite_is_none: bool = False,
) -> PlainValidator:
    """An int in [lo, hi]; `counts` also takes whole floats (element counts written as 5e8); `infinite_is_none`
    reads +inf as null (Accelerate writes `steps_per_print: inf` for "never")."""
    if lo is not None and hi is not None:
        what = f"an integer {lo}-{hi}"
    else:
        what = f"an integer >= {lo}" if lo is not None else "an integer"
    if counts:
        what += " (5e8-style whole numbers are fine)"
    if optional:
        what += " or null"

    def check(v: Any) -> int | None:
        if (v is None and optional) or (infinite_is_none and isinstance(v, float) and v == math.inf):
            return None
        if counts and isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise leaf_error(what, v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise leaf_error(what, v)
        return v

    return PlainValidator(check)


def number(
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    optional: bool = False,
) -> PlainValidator:
    """A finite float in the given (closed or open) interval; ints are accepted; None too if `optional`."""
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}")
    what = "a number" + (" " + " and ".join(parts) if parts else "") + (" or null" if optional else "")

    def check(v: Any) -> float | None:
        if v is None and optional:
            return None
        try:
            f = float(v) if _is_number(v) else math.nan
        except OverflowError:  # an int beyond float range
            f = math.nan
        if not math.isfinite(f):
            raise leaf_error(what, v)
        v = f
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise leaf_error(what, v)
        if hi is not None and (v > hi or (hi_open and v == hi)):
            raise leaf_error(what, v)
        return v

    return PlainValidator(check)


def choice(options: dict[str, Any], *, allow_none: bool = False, note: str = "") -> PlainValidator:
    """One of `options` (keys are matched case-insensitively; values are what gets stored)."""
    what = "one of " + ", ".join(repr(v) for v in dict.fromkeys(options.values()))
    what += " or null" if allow_none else ""
    what += f" {note}" if note else ""

    def check(v: Any) -> Any:
        if v is None and allow_none:
            return None
        if isinstance(v, str) and v.strip().lower() in options:
            return options[v.strip().lower()]
        raise leaf_error(what, v)

    return PlainValidator(check)


def ratio_or_auto() -> PlainValidator:
    """A fraction in (0, 1], or "auto" (the engine picks it at run time)."""
    what = 'a number > 0 and <= 1, or "auto"'

    def check(v: Any) -> float | str:
        if isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
        if not _is_number(v) or not (0.0 < float(v) <= 1.0):
            raise leaf_error(what, v)
        return float(v)

    return PlainValidator(check)


def beta_pair() -> PlainValidator:
    def check(v: Any) -> tuple[float, float]:
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            raise leaf_error("a list of two numbers in [0, 1), e.g. [0.9, 0.999]", v)
        if not all(_is_number(b) and 0.0 <= b < 1.0 for b in v):
            raise leaf_error("two numbers in [0, 1), e.g. [0.9, 0.999]", v)
        return (float(v[0]), float(v[1]))

    return PlainValidator(check)


# Needed next to a PlainValidator on a tuple field: pydantic otherwise warns when dumping it to JSON.
AS_LIST = PlainSerializer(lambda v: [float(x) for x in v], return_type=list[float], when_used="json")


def names(v: Any) -> list[str] | None:
    """A list of strings (module or class names), or null."""
    if v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        return v
    raise leaf_error("a list of strings or null", v)


# DeepSpeed's dtype names (runtime/config.py DtypeEnum), read as zero_core's short names
DTYPES = {name: short for short, spelled in (("fp16", ("fp16", "float16", "half", "torch.float16")),
                                             ("bf16", ("bf16", "bfloat16", "torch.bfloat16")),
                                             ("fp32", ("fp32", "float32", "float", "torch.float32")))
          for name in spelled}


def optional_text(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise leaf_error("a string path or null", v)


Bool = Annotated[bool, boolean()]
OptionalBool = Annotated[bool | None, boolean(optional=True)]
Names = Annotated[list[str] | None, PlainValidator(names)]
Dtype = Annotated[str | None, choice(DTYPES, allow_none=True)]
Text = Annotated[str | None, PlainValidator(optional_text)]
Count = Annotated[int, integer(0, counts=True)]  # an element count (bucket sizes, thresholds)
Opaque = dict[str, Any] | None  # a section zero_core does not read: carried through as given


class Section(BaseModel):
    """The base of every config section: unknown keys are refused, and a loaded config does not change."""

    model_config = ConfigDict(extra="forbid", frozen=True)

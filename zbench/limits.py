"""Bounded values for user input: whole numbers that are really integers, finite reals, true/false, paths.

pydantic's lax mode turns `8.0`, `1e30` and `"64"` into ints and `True` into 1, and lets `.inf` and
`.nan` through a `gt=0` bound. These annotated types refuse all of that, and say the valid range:

    batch_size: count(1, MAX_BATCH)        ->  batch_size must be a whole number from 1 to 65,536, got 1e+30

The bounds are generous (no real run comes near them) but finite, so a typo or a crafted file fails
at parse time instead of as an allocation or an overflow inside a rank. The scenario's named bounds
(Batch, SeqLen, ...) and `Strict`, the base of its sections, live here too.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from zero_core.config_errors import leaf, leaf_error

from .bounds import MAX_BATCH, MAX_EPOCHS, MAX_GRAD_ACCUM, MAX_LABELS, MAX_NODES, MAX_RANKS  # noqa: F401
from .bounds import MAX_SAMPLES, MAX_SEED, MAX_SEQ, MAX_STEPS, MAX_TIMEOUT_S  # noqa: F401


def _range(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    """'(x > 0)', '(0 < x <= 604,800)': the range in one glance, open or closed at each end."""
    if lo is None and hi is None:
        return ""
    if hi is None:
        return f"(x {'>' if lo_open else '>='} {lo:,g})"
    left = "" if lo is None else f"{lo:,g} {'<' if lo_open else '<='} "
    return f"({left}x {'<' if hi_open else '<='} {hi:,g})"


def check_count(value: Any, lo: int, hi: int) -> int | None:
    """The message's "must be ..." part when `value` is not an int in lo..hi, else None."""
    if type(value) is not int or not lo <= value <= hi:
        return f"a whole number from {lo:,} to {hi:,}"
    return None


def count(lo: int, hi: int) -> Any:
    """An int field in lo..hi: never a float (8.0, 1e30), a bool or a quoted number."""

    def check(value: Any) -> int:
        expected = check_count(value, lo, hi)
        if expected:
            raise leaf_error(expected + (" (without quotes)" if isinstance(value, str) else ""), value)
        return value

    return Annotated[int, BeforeValidator(check)]


def check_real(
    value: Any, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False
) -> str | None:
    """The message's "must be ..." part when `value` is not a finite number in the range, else None."""
    try:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an integer past a float's range
        ok = False
    ok = ok and (lo is None or (value > lo if lo_open else value >= lo))
    ok = ok and (hi is None or (value < hi if hi_open else value <= hi))
    return None if ok else f"a finite number {_range(lo, hi, lo_open, hi_open)}".rstrip()


def real(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False) -> Any:
    """A float field: a finite number (an int is fine) in the range; never a bool, a string, .inf or .nan."""

    def check(value: Any) -> float:
        expected = check_real(value, lo, hi, lo_open=lo_open, hi_open=hi_open)
        if expected:
            raise leaf_error(expected, value)
        return float(value)

    return Annotated[float, BeforeValidator(check)]


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise leaf_error("true or false", value)
    return value


Flag = Annotated[bool, BeforeValidator(_flag)]  # never 1, "yes" as a string, ...


def path_to(what: str) -> Any:
    """A str field naming the path of `what`: never empty (that would name the scenario's own folder), never a
    mapping or a number (a config written inline is not read as its file)."""

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise leaf_error(f"the path of {what} (relative to the scenario file)", value)
        if not value.strip():
            raise leaf(f"is empty; give the path of {what}, or leave the key out")
        return value

    return Annotated[str, BeforeValidator(check)]


# the scenario's named bounds
Batch = count(1, MAX_BATCH)
SeqLen = count(1, MAX_SEQ)
Steps = count(0, MAX_STEPS)
Positive = real(0, lo_open=True)
NonNegative = real(0)
Fraction = real(0, 1, lo_open=True, hi_open=True)
Samples = count(1, MAX_SAMPLES)


class Strict(BaseModel):
    """The base of every scenario section: unknown keys are refused, and a parsed scenario does not change."""

    model_config = ConfigDict(extra="forbid", frozen=True)

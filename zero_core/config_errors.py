"""One-line config errors: every message names the dotted key path and says how to fix it.

Leaf validators raise `leaf_error` ("must be ..., got ...") and the path is prefixed here from
pydantic's error location; cross-field checks return `Problem`s with their full message. pydantic's own
multi-line report never reaches the user: each of its errors is translated to one message, and all
the problems of a config are joined into one numbered line (`combined`).
"""

from __future__ import annotations

import reprlib

import difflib
import types
import typing
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from .config_keys import refused_outright

# Hints for the few keys that have no default.
REQUIRED = {
    "optimizer.type": "set it to 'AdamW' or 'Adam'",
    "scheduler.type": "set it to 'WarmupLR' or 'WarmupDecayLR'",
}


class ConfigError(ValueError):
    """A user error in the config; str(e) is ONE line naming the problem and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(with_fix(" ".join(str(message).split())))  # never let a newline through


class UnsupportedFeature(ConfigError):
    """A valid setting of a feature zero_core does not have: not the user's mistake, so a runner may show it as a
    row that could not run instead of refusing the whole scenario. Raised only when it is the config's sole problem."""


class Problem(NamedTuple):
    keys: tuple[str, ...]  # the dotted keys it involves (a problem about a key that was itself bad is dropped)
    message: str
    lacking: bool = False  # a feature zero_core lacks (UnsupportedFeature), not a setting to fix


def _fix_for(expected: str) -> str:
    """How to fix a value that "must be `expected`": said once for each kind of expectation."""
    if expected.startswith("a whole number from"):
        quotes = ", without quotes" if "(without quotes)" in expected else ""
        return f"set it to a whole number in that range{quotes}"
    if expected.startswith("a finite number"):
        return "set it to a finite number" + (" in that range" if "(" in expected else "")
    if expected.startswith("true or false"):
        return "write true or false" + (" or null" if expected.startswith("true or false or null") else "")
    if expected.startswith("an object"):
        return "write it as a JSON {...} mapping of keys to values"
    return f"set it to {expected.split(' (')[0]}"


def with_fix(message: str) -> str:
    """`message` with its fix: a message that says what is wrong but not how to fix it ("X must be Y, got Z")
    gets "; set it to Y" (or its kind's shorter words). A message that already has a fix part is kept."""
    if "; " in message or " must be " not in message or ", got " not in message:
        return message
    expected = message.split(" must be ", 1)[1].rpartition(", got ")[0]
    return f"{message}; {_fix_for(expected)}" if expected else message


# pydantic's own error types that zero_core's validators do not replace, and how to fix each
_PYDANTIC_FIXES = {
    "int_type": "write a whole number", "int_parsing": "write a whole number", "int_from_float": "write a whole number",
    "float_type": "write a number", "float_parsing": "write a number", "string_type": "write it as text in quotes",
    "bool_type": "write true or false", "bool_parsing": "write true or false", "list_type": "write it as a list [...]",
    "tuple_type": "write it as a list [...]",
}


def _pydantic_fix(error: dict[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    if error["type"] in ("literal_error", "enum") and ctx.get("expected"):
        return f"use {ctx['expected']}"
    return _PYDANTIC_FIXES.get(error["type"], "correct the value as the message says")


def combined(messages: list[str]) -> str:
    """One line for all of a config's problems (a single one keeps its own message). Each problem already has
    "; " before its fix, so the problems are numbered and set apart by " | " instead:
    "config has 2 problems: (1) <what>; <fix> | (2) <what>; <fix>"."""
    unique = list(dict.fromkeys(messages))
    if len(unique) == 1:
        return unique[0]
    return f"config has {len(unique)} problems: " + " | ".join(f"({i}) {m}" for i, m in enumerate(unique, 1))


def show(value: Any, limit: int = 60) -> str:
    """A short one-line repr of a user value for messages."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"  # repr refuses one past 4300 digits
    text = reprlib.repr(value) if isinstance(value, (dict, list, tuple)) else repr(value)  # bounded depth
    return text if len(text) <= limit else text[: limit - 3] + "..."


def leaf(message: str) -> PydanticCustomError:
    """Raised by leaf validators; the formatter prefixes the key path to `message`."""
    return PydanticCustomError("zero_leaf", "{msg}", {"msg": message})


def leaf_error(expected: str, got: Any) -> PydanticCustomError:
    return leaf(f"must be {expected}, got {show(got)}")


def full_error(message: str, drop: str) -> PydanticCustomError:
    """Raised by model validators whose message already names every key; `drop` is the key of the section
    to leave out so that the rest of the config can still be checked."""
    return PydanticCustomError("zero_full", "{msg}", {"msg": message, "drop": drop})


def dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _section_name(loc: tuple[Any, ...]) -> str:
    return f"'{dotted(loc)}'" if loc else "the top level"


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `Foo | None` or `Annotated[Foo, ...]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _section_model(arg)
            if found is not None:
                return found
    return None


def valid_keys(root: type[BaseModel], section: tuple[Any, ...]) -> list[str]:
    """Field names of the section at `section` (a path of keys from the root model)."""
    model: type[BaseModel] | None = root
    for part in section:
        field = model.model_fields.get(str(part)) if model is not None else None
        model = _section_model(field.annotation) if field is not None else None
    return sorted(model.model_fields) if model is not None else []


def _paths_of(model: type[BaseModel], key: str, prefix: str = "") -> list[str]:
    """Dotted paths where `key` is a valid field, for keys put in the wrong section."""
    found = [prefix + key] if key in model.model_fields else []
    for name, field in model.model_fields.items():
        sub = _section_model(field.annotation)
        if sub is not None:
            found += _paths_of(sub, key, f"{prefix}{name}.")
    return found


def unknown_key_message(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    path, key = dotted(loc), str(loc[-1])
    refused = refused_outright()
    if path in refused:
        return f"key '{path}' is not supported by zero_core; {refused[path]}"
    keys = valid_keys(root, loc[:-1])
    elsewhere = _paths_of(root, key)
    if len(elsewhere) == 1:  # a key of one other section (a generic name such as 'enabled' says nothing)
        return f"unknown key '{path}'; it belongs under '{elsewhere[0]}', move it there"
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if close:
        return f"unknown key '{path}'; did you mean '{close[0]}'?"
    section = _section_name(loc[:-1])
    return f"unknown key '{path}'; remove it or use one of the valid keys of {section}: {', '.join(keys)}"


def primary_error(err: ValidationError) -> dict[str, Any]:
    """The error to show: an unknown key first (a typo is usually why a required key is "missing"),
    else pydantic's first."""
    errors = err.errors(include_url=False)
    return next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])


def from_validation_error(err: ValidationError, root: type[BaseModel]) -> ConfigError:
    """Translate the primary pydantic error into one ConfigError line."""
    return ConfigError(message_of(primary_error(err), root))


def every_error(err: ValidationError, root: type[BaseModel]) -> list[tuple[str | None, tuple[Any, ...] | None]]:
    """Each pydantic error as (message, the location to leave out to check the rest; None: nothing can be).

    A required key reported missing next to an unknown key that looks like it (a typo) has no message of
    its own (None): the typo's message says it."""
    errors = err.errors(include_url=False)
    typos = {(tuple(e["loc"][:-1]), str(e["loc"][-1])) for e in errors if e["type"] == "extra_forbidden"}
    out = []
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] == "missing" and any(s == loc[:-1] and difflib.get_close_matches(str(loc[-1]), [k], cutoff=0.6)
                                          for s, k in typos):
            out.append((None, loc[:-1]))
            continue
        out.append((message_of(e, root), _left_out(e, loc)))
    return out


def _left_out(error: dict[str, Any], loc: tuple[Any, ...]) -> tuple[Any, ...] | None:
    if error["type"] == "missing":
        loc = loc[:-1]  # a section without its required key cannot be built
    elif error["type"] == "zero_full":
        loc = loc + (error["ctx"]["drop"],)
    return loc or None


def message_of(error: dict[str, Any], root: type[BaseModel]) -> str:
    """One pydantic error as one line naming its key and the fix."""
    loc, kind, ctx = tuple(error["loc"]), error["type"], error.get("ctx") or {}
    path = dotted(loc) or "config"
    if kind == "zero_leaf":
        return with_fix(f"{path} {ctx['msg']}")
    if kind == "zero_full":
        return ctx["msg"]
    if kind == "extra_forbidden":
        return unknown_key_message(root, loc)
    if kind == "missing":
        return f"{path} is required; {REQUIRED.get(path, 'add it to the config')}"
    if kind == "invalid_key":
        return (f"key {show(error.get('input'))} in {_section_name(loc[:-1])} is not a string; "
                "config keys must be strings")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return with_fix(f"{path} must be an object (a JSON {{...}} mapping), got {show(error.get('input'))}")
    if isinstance(ctx.get("error"), ConfigError):
        return str(ctx["error"])
    return f"{path}: {error['msg']} (got {show(error.get('input'))}); {_pydantic_fix(error)}"

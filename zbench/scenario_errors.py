"""Scenario errors: pydantic's first error as one line that names the key as the file writes it.

zero_core's formatter does the work (unknown keys with the closest valid one, missing keys, leaf
messages); here list items read `variants[1].stage` rather than `variants.1.stage`, and an unknown key
inside a list item is looked up in that item's model.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from zero_core import ConfigError
from zero_core.config_errors import dotted, from_validation_error, primary_error, unknown_key_message


class ScenarioError(ConfigError):
    """A user error in a scenario: one line naming the key and the fix."""


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model at `loc` below `root`, stepping through lists and optionals."""
    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part)) if model is not None else None
        model = _inner_model(field.annotation) if field is not None else None
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def key_path(loc: tuple[Any, ...]) -> str:
    """variants[1].stage rather than variants.1.stage."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def translate(err: ValidationError, root: type[BaseModel]) -> ScenarioError:
    """The primary pydantic error as one line, list items written as variants[1]."""
    first = primary_error(err)
    loc = tuple(first["loc"])
    ints = [i for i, p in enumerate(loc) if isinstance(p, int)]
    if first["type"] == "extra_forbidden" and ints:
        # zero_core's helper walks nested models but not lists: hand it the list item's model
        cut = ints[-1] + 1
        item = _model_at(root, loc[:cut])
        if item is not None:
            msg = unknown_key_message(item, loc[cut:])
            return ScenarioError(msg.replace(f"'{dotted(loc[cut:])}'", f"'{key_path(loc)}'", 1))
    if first["type"] == "missing":
        return ScenarioError(f"{key_path(loc)} is required; add it to the scenario")
    if first["type"] == "value_error":
        where = key_path(loc)
        text = str(first["msg"]).removeprefix("Value error, ")
        return ScenarioError(f"{where}: {text}" if where else text)
    msg = str(from_validation_error(err, root))
    return ScenarioError(msg.replace(dotted(loc), key_path(loc), 1) if loc else msg)

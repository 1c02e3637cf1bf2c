"""One-line config errors: every message names the dotted key path and says how to fix it.

Leaf validators raise `leaf_error` ("must be ..., got ...") and the path is prefixed here from
pydantic's error location; cross-field checks raise `ConfigError` directly with the full message.
pydantic's own multi-line report never reaches the user: only its first error is translated.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

# Keys DeepSpeed knows that zero_core deliberately lacks: say why instead of "unknown key".
NOT_SUPPORTED = {
    "amp": "use 'fp16' or 'bf16' instead",
    "activation_checkpointing": "use torch.utils.checkpoint inside the model instead",
    "pipeline": "pipeline parallelism is out of scope; remove it",
    "sparse_attention": "it is a model feature, not an engine one; remove it",
    "sparse_gradients": "gradients are always dense; remove it",
    "elasticity": "set the batch sizes explicitly instead",
    "compression_training": "compression is out of scope; remove it",
    "data_efficiency": "curriculum / data routing is out of scope; remove it",
    "curriculum_learning": "curriculum learning is out of scope; remove it",
    "quantize_training": "quantized training is out of scope; remove it",
    "autotuning": "run zbench scenarios to tune instead; remove it",
    "nebula": "checkpoints use zbench's own format; remove it",
    "data_types": "gradients always accumulate in fp32 partitions; remove it",
    "zero_optimization.cpu_offload": "it is deprecated in DeepSpeed too (and offload is not supported yet); remove it",
    "zero_optimization.cpu_offload_param": "it is deprecated in DeepSpeed too (and offload is not supported yet); remove it",
    "optimizer.params.max_grad_norm": "use the top-level 'gradient_clipping' key instead (DeepSpeed rejects it too)",
}

# Hints for the few keys that have no default.
REQUIRED = {
    "optimizer.type": "set it to 'AdamW' or 'Adam'",
    "scheduler.type": "set it to 'WarmupLR' or 'WarmupDecayLR'",
}


class ConfigError(ValueError):
    """A user error in the config; str(e) is ONE line naming the problem and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))  # never let a newline through


def show(value: Any, limit: int = 60) -> str:
    """A short one-line repr of a user value for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def leaf(message: str) -> PydanticCustomError:
    """Raised by leaf validators; the formatter prefixes the key path to `message`."""
    return PydanticCustomError("zero_leaf", "{msg}", {"msg": message})


def leaf_error(expected: str, got: Any) -> PydanticCustomError:
    return leaf(f"must be {expected}, got {show(got)}")


def full_error(message: str) -> PydanticCustomError:
    """Raised by model validators whose message already names every key."""
    return PydanticCustomError("zero_full", "{msg}", {"msg": message})


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
    if path in NOT_SUPPORTED:
        return f"key '{path}' is not supported by zero_core; {NOT_SUPPORTED[path]}"
    keys = valid_keys(root, loc[:-1])
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if close:
        return f"unknown key '{path}'; did you mean '{close[0]}'?"
    elsewhere = _paths_of(root, key)
    if elsewhere:
        return f"unknown key '{path}'; it belongs under '{elsewhere[0]}', move it there"
    section = _section_name(loc[:-1])
    return f"unknown key '{path}'; remove it or use one of the valid keys of {section}: {', '.join(keys)}"


def primary_error(err: ValidationError) -> dict[str, Any]:
    """The error to show: an unknown key first (a typo is usually why a required key is "missing"),
    else pydantic's first."""
    errors = err.errors(include_url=False)
    return next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])


def from_validation_error(err: ValidationError, root: type[BaseModel]) -> ConfigError:
    """Translate the primary pydantic error into one ConfigError line."""
    first = primary_error(err)
    loc, kind, ctx = tuple(first["loc"]), first["type"], first.get("ctx") or {}
    path = dotted(loc) or "config"
    if kind == "zero_leaf":
        return ConfigError(f"{path} {ctx['msg']}")
    if kind == "zero_full":
        return ConfigError(ctx["msg"])
    if kind == "extra_forbidden":
        return ConfigError(unknown_key_message(root, loc))
    if kind == "missing":
        return ConfigError(f"{path} is required; {REQUIRED.get(path, 'add it to the config')}")
    if kind == "invalid_key":
        return ConfigError(f"key {show(first.get('input'))} in {_section_name(loc[:-1])} is not a string; "
                           "config keys must be strings")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return ConfigError(f"{path} must be an object (a JSON {{...}} mapping), got {show(first.get('input'))}")
    if isinstance(ctx.get("error"), ConfigError):
        return ctx["error"]
    return ConfigError(f"{path}: {first['msg']} (got {show(first.get('input'))})")

"""DeepSpeed keys zero_core accepts only where they change nothing (their rows in config_keys.py with `accepts`):
each one set to another value is a `Problem` naming the key, why zero_core does not do it, and the fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from .config_errors import Problem, show
from .config_keys import Key, is_accepted, refused_unless_accepted
from .config_models import ZeroConfig

_OWN_CHECKS = ("aio.",)  # config_checks._aio says more about these


def refused_values(cfg: ZeroConfig) -> Iterator[Problem]:
    for row in refused_unless_accepted():
        if row.path.startswith(_OWN_CHECKS):
            continue
        found, value = _given(cfg, row.path)
        if found:
            yield from _check(row, value)
    yield from _data_types(cfg)


def _given(model: BaseModel, path: str) -> tuple[bool, Any]:
    """(whether the config sets the key at `path`, its value)."""
    *sections, name = path.split(".")
    for part in sections:
        if part not in model.model_fields_set or not isinstance(getattr(model, part), BaseModel):
            return False, None
        model = getattr(model, part)
    return (name in model.model_fields_set), getattr(model, name, None)


def _text(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False)[:60]
    except (TypeError, ValueError):
        return show(value)


def _switches(section: dict, name: str, prefix: str) -> Iterator[tuple[str, Any]]:
    """Every key called `name` in `section`, at any depth (DeepSpeed reads data_efficiency's nested ones too)."""
    for key, value in section.items():
        if key == name:
            yield f"{prefix}.{key}", value
        if isinstance(value, dict):
            yield from _switches(value, name, f"{prefix}.{key}")


def _check(row: Key, value: Any) -> Iterator[Problem]:
    if row.switch:  # a whole section: refused while a switch in it is on
        found = _switches(value or {}, row.switch, row.path)
        on = [(where, v) for where, v in found if not is_accepted(v, row.accepts)]
        if on:
            where, v = on[0]
            yield Problem((row.path,), f"{where}={_text(v)} is not supported by zero_core: {row.why}; remove "
                          f"'{row.path}' or set {row.switch} to {_text(row.accepts[0])}", lacking=True)
    elif not is_accepted(value, row.accepts):
        yield Problem((row.path,), f"{row.path}={_text(value)} is not supported by zero_core: {row.why}; remove it "
                      f"or set {_text(row.accepts[0])}", lacking=True)


def _data_types(cfg: ZeroConfig) -> Iterator[Problem]:
    """DeepSpeed requires param_dtype to be the working precision (buffer_dtype may name any: buffer_dtypes.py);
    gradients accumulate in the working precision or in fp32."""
    types = cfg.data_types
    working = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}.get(str(cfg.dtype), "fp32")
    given = types.param_dtype if types is not None else None
    if given is not None and given != working:
        yield Problem(
            ("data_types.param_dtype",),
            f"data_types.param_dtype='{given}' is not the working precision '{working}' (set by fp16/bf16.enabled), "
            "which the parameters run in; set it to that or remove it",
        )
    accum = types.grad_accum_dtype if types is not None else None
    if accum is not None and accum not in (working, "fp32"):  # 16-bit sums of another precision's gradients
        yield Problem(
            ("data_types.grad_accum_dtype",),
            f"data_types.grad_accum_dtype='{accum}' is neither the working precision '{working}' (set by "
            "fp16/bf16.enabled) nor 'fp32'; set one of those or remove it",
        )

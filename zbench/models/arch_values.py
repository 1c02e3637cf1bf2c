"""The values an architecture config may hold, checked before anything is built or launched.

`gpt` configs: every GPTConfig field has a type and a range (`gpt.GPT_RANGES`), unknown fields are
named with the closest valid one. `hf` configs go to transformers, which takes almost anything and
fails later inside a rank; here an override must keep the JSON type of the value it replaces, the
common size keys must be positive whole numbers within a bound, and every number must be finite.

`label(key)` names a value as the user wrote it: `model.overrides.n_head`, or the file and its key.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import fields
from typing import Any, Callable

from zero_core import ConfigError
from zero_core.config_errors import show

from ..limits import check_count, check_real
from .gpt import GPT_RANGES, GPTConfig

Label = Callable[[str], str]

_LAYERS, _WIDTH, _HEADS = (1, 10_000), (1, 1 << 20), (1, 65_536)
# size keys of transformers configs -> the whole-number range they must lie in
HF_SIZES: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers"), _LAYERS),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "d_ff", "d_kv",
                     "encoder_ffn_dim", "decoder_ffn_dim"), _WIDTH),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "num_key_value_heads"), _HEADS),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx"), GPT_RANGES["block_size"]),
    "vocab_size": GPT_RANGES["vocab_size"],
}
HF_NULLABLE = {"n_inner", "num_key_value_heads"}  # null means "derive it" in the configs that have them
_JSON_TYPES = {bool: "true or false", int: "a whole number", float: "a number", str: "a string", list: "a list",
               dict: "a mapping"}


def _fail(label: Label, key: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{label(key)} must be {expected}, got {show(value)}")


def check_gpt(config: dict[str, Any], label: Label) -> None:
    """Each key a GPTConfig field, each value of its type and in its range."""
    valid = sorted(f.name for f in fields(GPTConfig))
    for key, value in config.items():
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"the fields are {', '.join(valid)}"
            raise ConfigError(f"{label(key)} is not a GPT field; {hint}")
        if key == "dropout":
            expected = check_real(value, 0, 1, hi_open=True)
        else:
            expected = check_count(value, *GPT_RANGES[key])
        if expected:
            raise _fail(label, key, expected, value)


def check_gpt_shape(config: dict[str, Any], where: str) -> None:
    """Cross-field rules of the whole config (after overrides)."""
    d = {f.name: f.default for f in fields(GPTConfig)} | config
    if d["n_embd"] % d["n_head"]:
        raise ConfigError(f"{where}: n_embd {d['n_embd']} is not divisible by n_head {d['n_head']}; pick an n_head "
                          "that divides n_embd (each head gets n_embd / n_head dimensions)")


def _json_problem(value: Any, depth: int = 0) -> str | None:
    """Why `value` is not plain JSON with finite numbers (a sentence), or None."""
    if depth > 32:
        return "nested too deeply"
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "not a finite number"
    if isinstance(value, list):
        return next((p for p in (_json_problem(v, depth + 1) for v in value) if p), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "a mapping with keys that are not strings"
        return next((p for p in (_json_problem(v, depth + 1) for v in value.values()) if p), None)
    return f"a {type(value).__name__}, not a JSON value"


def _json_type(value: Any) -> type:
    return type(value) if type(value) in _JSON_TYPES else object


def check_hf(config: dict[str, Any], base: dict[str, Any], label: Label) -> None:
    """Plain JSON values; the type of the base config's value kept (an int may replace a float);
    size keys positive whole numbers in their range."""
    for key, value in config.items():
        problem = _json_problem(value)
        if problem:
            raise ConfigError(f"{label(key)} is {problem} ({show(value)}); use a plain JSON value")
        old = base.get(key)
        if key in HF_SIZES and not (value is None and key in HF_NULLABLE):
            expected = check_count(value, *HF_SIZES[key])
            if expected:
                raise _fail(label, key, expected, value)
        elif old is not None and value is not None and _json_type(value) is not _json_type(old) \
                and not (_json_type(old) is float and _json_type(value) is int):
            raise _fail(label, key, f"{_JSON_TYPES.get(_json_type(old), 'the same type')} like the base config's "
                        f"{show(old)}", value)

"""Fuzzing the strict config: random and mutated seed configs either load or raise one ConfigError line."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from config_helpers import SEEDS, TRAINER
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from zero_core.config import ConfigError, ZeroConfig, describe, load_config
from zero_core.config_errors import _section_model

SEED_CONFIGS = [json.loads(p.read_text()) for p in sorted(SEEDS.glob("*.json"))]


def _paths(d: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(d, dict):
        for k, v in d.items():
            out.add(prefix + str(k))
            out |= _paths(v, prefix + str(k) + ".")
    return out


def _model_keys(model: type[BaseModel]) -> set[str]:
    keys = set(model.model_fields)
    for field in model.model_fields.values():
        sub = _section_model(field.annotation)
        if sub is not None:
            keys |= _model_keys(sub)
    return keys


KEYS = sorted(_model_keys(ZeroConfig) | {"type", "params", "bfloat16", "stgae", "amp", "max_grad_norm", ""})
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-3, 2**40)
    | st.integers()
    | st.just(10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(
        ["auto", "true", "cpu", "none", "nvme", "AdamW", "Adam", "WarmupLR", "WarmupDecayLR", "linear", "fp32", "bf16"]
    )
)
values = st.recursive(
    leaves,
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), kids, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def mutated_seed(draw: st.DrawFn) -> dict:
    """A seed config with one value somewhere replaced by garbage (or a key added)."""
    raw = copy.deepcopy(draw(st.sampled_from(SEED_CONFIGS)))
    node = raw
    while True:
        key = draw(st.sampled_from(sorted(node) + [draw(st.sampled_from(KEYS))]))
        if isinstance(node.get(key), dict) and draw(st.booleans()):
            node = node[key]
            continue
        node[key] = draw(values)
        return raw


def _check_outcome(config: Any, world_size: int, auto: dict | None) -> None:
    try:
        cfg = load_config(config, world_size, auto=auto)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert isinstance(cfg, ZeroConfig)
    tb, mb, gas = cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps
    assert tb == mb * gas * world_size
    assert math.isfinite(cfg.optimizer.params.lr)
    json.loads(describe(cfg))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config=st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), values, max_size=6) | values,
    world_size=st.integers(1, 8),
    auto=st.sampled_from([None, TRAINER]),
)
def test_fuzz_random_configs_only_raise_config_error(config, world_size, auto):
    _check_outcome(config, world_size, auto)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=mutated_seed(), world_size=st.integers(1, 8))
def test_fuzz_mutated_seed_configs_only_raise_config_error(config, world_size):
    _check_outcome(config, world_size, TRAINER)  # the seeds' "auto" values filled, as a trainer would

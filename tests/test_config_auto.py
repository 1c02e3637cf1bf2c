""" "auto" in DeepSpeed configs: filled exactly as Hugging Face's Trainer fills them, every problem reported at once."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from config_helpers import error

import zero_core
from zero_core import AutoValues, ConfigError, fill_auto, load_config
from zero_core.config_auto import resolve_auto

HERE = Path(__file__).parent
SEEDS = HERE / "data" / "seed_configs"
HF = json.loads(
    (HERE / "fixtures" / "hf_auto" / "filled.json").read_text()
)  # made by tests/fixtures/make_hf_auto_fixtures.py
MB = {"train_micro_batch_size_per_gpu": 4}


def _config(name: str) -> dict:
    return HF["contradicting"] if name == "contradicting" else json.loads((SEEDS / name).read_text())


def _problem_keys(message: str) -> set[str]:
    return set(re.findall(r"([a-z0-9_.]+) is [^;]*? in the config but", message))


@pytest.mark.parametrize("case", HF["cases"], ids=[f"{c['config']}-{c['args']}" for c in HF["cases"]])
def test_fill_auto_equals_hugging_face(case):
    config, values = _config(case["config"]), AutoValues(**HF["args"][case["args"]])
    if "filled" in case:
        assert fill_auto(config, values)[0] == case["filled"]
        return
    expected = set(case["mismatched"])
    if case["config"] == "000_zero2_config_accelerate.json":
        # HF compares raw JSON: "enabled": "true" vs fp16=True is its mismatch; zero_core reads "true" as true
        assert config["fp16"]["enabled"] == "true" and "fp16.enabled" in expected
        expected.discard("fp16.enabled") if values.fp16 else None
    if not expected:
        fill_auto(config, values)
        return
    with pytest.raises(ConfigError) as info:
        fill_auto(config, values)
    assert _problem_keys(str(info.value)) == expected


def test_mismatches_are_reported_together_in_one_line():
    with pytest.raises(ConfigError) as info:
        load_config(HF["contradicting"], 2, auto=HF["args"]["bf16"])
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("config has 13 problems: ")
    assert "optimizer.params.lr is 1e-06 in the config but the caller's learning_rate gives 0.0002" in msg
    assert (
        "train_batch_size is 10 in the config but the caller's world_size * per_device_train_batch_size * "
        "gradient_accumulation_steps gives 12" in msg
    )
    assert "bf16.enabled is false in the config but the caller's fp16/bf16 gives true" in msg


def test_unfilled_autos_are_all_named():
    raw = json.loads((SEEDS / "000_zero2_config_accelerate.json").read_text())
    with pytest.raises(ConfigError) as info:
        load_config(raw, 2)
    msg = str(info.value)
    assert msg.startswith("config has 5 problems: ")
    for key, field in [
        ("optimizer.params.lr", "learning_rate"),
        ("scheduler.params.warmup_max_lr", "learning_rate"),
        ("scheduler.params.total_num_steps", "max_steps"),
        ("scheduler.params.warmup_num_steps", "warmup_steps"),
        ("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
    ]:
        assert f"{key} cannot be 'auto' without {field} (auto={{\"{field}\": ...}})" in msg


@pytest.mark.parametrize(
    "config, path",
    [
        ({**MB, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, "optimizer.params.lr"),
        (
            {**MB, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}},
            "scheduler.params.warmup_num_steps",
        ),
        (
            {**MB, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}},
            "scheduler.params.total_num_steps",
        ),
        ({**MB, "fp16": {"enabled": "auto"}}, "fp16.enabled"),
        ({**MB, "bf16": {"enabled": "auto"}}, "bf16.enabled"),
    ],
)
def test_unresolvable_auto_asks_for_a_value(config, path):
    msg = error(config)
    assert msg.startswith(f"{path} cannot be 'auto' without ") and "set " in msg


def test_unresolvable_lr_is_named_where_it_is_used_too():
    msg = error(
        {
            **MB,
            "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}},
        }
    )
    assert msg.startswith("config has 2 problems: (1) optimizer.params.lr cannot be 'auto' without learning_rate")
    assert " | (2) scheduler.params.warmup_max_lr cannot be 'auto' without learning_rate" in msg


def test_precision_auto_needs_a_precision():
    raw = {**MB, "bf16": {"enabled": "auto"}}
    with pytest.raises(ConfigError, match=r"^bf16.enabled cannot be 'auto' without fp16/bf16"):
        load_config(raw, 1)
    assert load_config(raw, 1, auto={"bf16": True}).bf16.enabled
    assert not load_config(raw, 1, auto={"fp16": True}).bf16.enabled  # the other one given: this one is off


def test_defaults_without_values_are_hf_and_deepspeed_ones():
    raw = {
        **MB,
        "gradient_clipping": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": 5},
        },
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "allgather_bucket_size": "auto",
        },
    }
    out, filled = fill_auto(raw)
    assert out["gradient_clipping"] == 1.0 and out["optimizer"]["params"] == {
        "lr": 1e-4,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "weight_decay": 0.0,
    }
    assert out["scheduler"]["params"] == {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-4, "warmup_num_steps": 5}
    zero = out["zero_optimization"]
    assert (
        zero["reduce_bucket_size"],
        zero["stage3_prefetch_bucket_size"],
        zero["stage3_param_persistence_threshold"],
        zero["allgather_bucket_size"],
    ) == (500_000_000, 50_000_000, 100_000, 500_000_000)
    assert ("gradient_clipping", 1.0) in filled and len(filled) == 10


def test_hidden_size_keys_follow_hf():
    raw = {
        "zero_optimization": {
            "stage": 2,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        }
    }
    zero = fill_auto(raw, {"hidden_size": 100})[0]["zero_optimization"]
    assert (
        zero["reduce_bucket_size"],
        zero["stage3_prefetch_bucket_size"],
        zero["stage3_param_persistence_threshold"],
    ) == (10_000, 50_000_000, 100_000)  # HF fills the stage-3 keys at stage 3 only
    raw["zero_optimization"]["stage"] = 3
    zero = fill_auto(raw, {"hidden_size": 100})[0]["zero_optimization"]
    assert (zero["stage3_prefetch_bucket_size"], zero["stage3_param_persistence_threshold"]) == (9_000, 1_000)


def test_warmup_steps_are_at_least_one():
    raw = {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}}
    assert fill_auto(raw, {"warmup_steps": 0})[0]["scheduler"]["params"]["warmup_num_steps"] == 1
    assert fill_auto(raw, {"warmup_steps": 7})[0]["scheduler"]["params"]["warmup_num_steps"] == 7


def test_absent_keys_stay_absent_and_the_input_is_not_mutated():
    raw = {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    before = copy.deepcopy(raw)
    out, filled = fill_auto(raw, {"learning_rate": 0.5, "max_grad_norm": 0.1, "per_device_train_batch_size": 3})
    assert out == {"optimizer": {"type": "AdamW", "params": {"lr": 0.5}}} and filled == [("optimizer.params.lr", 0.5)]
    assert raw == before


def test_defaults_fill_only_and_values_match():
    raw = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-6, "eps": "auto"}}}
    out = fill_auto(raw, defaults={"learning_rate": 0.5, "adam_epsilon": 1e-5})[0]
    assert out["optimizer"]["params"] == {"lr": 1e-6, "eps": 1e-5}  # an explicit value wins over a default
    res = resolve_auto(raw, {"learning_rate": 0.5}, labels={"learning_rate": "--lr"})
    assert [p.message for p in res.problems] == [
        "optimizer.params.lr is 1e-06 in the config but --lr gives 0.5; "
        'make them agree or set optimizer.params.lr to "auto"'
    ]


def test_values_are_compared_as_zero_core_reads_them():
    raw = {
        "fp16": {"enabled": "true"},
        "zero_optimization": {"reduce_bucket_size": 2e8},
        "optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.999], "lr": 1}},
    }
    fill_auto(raw, {"fp16": True, "adam_beta1": 0.9, "learning_rate": 1.0})  # no mismatch


def test_auto_values_are_checked():
    with pytest.raises(ConfigError, match=r"^auto has no field 'learning_rat'; did you mean 'learning_rate'\?"):
        AutoValues.of({"learning_rat": 1e-3})
    with pytest.raises(
        ConfigError,
        match=r"^auto values: learning_rate must be a number >= 0, got -1; "
        r"warmup_steps must be an integer >= 0, got 1.5$",
    ):
        AutoValues(learning_rate=-1, warmup_steps=1.5)
    with pytest.raises(ConfigError, match="auto world_size 4 differs from the world size 2"):
        load_config(MB, 2, auto={"world_size": 4})


def test_initialize_passes_auto_to_the_config():
    raw = {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
        "bf16": {"enabled": "auto"},
    }
    engine = zero_core.initialize(
        torch.nn.Linear(4, 2), raw, auto=AutoValues(per_device_train_batch_size=3, learning_rate=0.25, bf16=True)
    )
    try:
        cfg = engine.config
        assert (cfg.train_micro_batch_size_per_gpu, cfg.optimizer.params.lr, cfg.bf16.enabled) == (3, 0.25, True)
    finally:
        engine.close()

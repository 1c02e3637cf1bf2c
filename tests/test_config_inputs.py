"""The strict DeepSpeed-style config: batch-size arithmetic and the inputs it is read from."""

from __future__ import annotations

import copy
import json

import pytest
from config_helpers import MB, error

from zero_core.config import load_config, resolve_batch


# -- batch sizes ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "given, ws, want",
    [
        ((32, 4, 2), 4, (32, 4, 2)),
        ((32, 4, None), 4, (32, 4, 2)),
        ((32, None, 2), 4, (32, 4, 2)),
        ((None, 4, 2), 4, (32, 4, 2)),
        ((32, None, None), 4, (32, 8, 1)),
        ((None, 4, None), 4, (16, 4, 1)),
        (("auto", 4, "auto"), 2, (8, 4, 1)),
    ],
)
def test_batch_resolution(given, ws, want):
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    cfg = load_config({k: v for k, v in zip(keys, given) if v is not None}, ws)
    got = tuple(getattr(cfg, k) for k in keys)
    assert got == want and all(type(v) is int for v in got)


def test_batch_mismatch_shows_the_arithmetic():
    msg = error({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 2)
    assert "train_batch_size (12)" in msg and "4 * 2 * 2 = 16" in msg


@pytest.mark.parametrize(
    "config, needle",
    [
        ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, "4 * 2 = 8"),
        ({"train_batch_size": 10, "gradient_accumulation_steps": 3}, "3 * 2 = 6"),
        ({"train_batch_size": 9}, "world_size = 1 * 2 = 2"),
    ],
)
def test_batch_not_divisible(config, needle):
    msg = error(config, 2)
    assert needle in msg and "cannot be derived" in msg


def test_missing_batch_size():
    assert "no batch size" in error({}) and "train_micro_batch_size_per_gpu" in error({})
    assert error({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}).startswith(
        "train_micro_batch_size_per_gpu cannot be 'auto' without per_device_train_batch_size"
    )
    assert "gradient_accumulation_steps alone" in error({"gradient_accumulation_steps": 4})


def test_resolve_batch_directly():
    assert resolve_batch(None, 2, 3, world_size=5) == (30, 2, 3)


# -- files and inputs -----------------------------------------------------------------------------
def test_path_inputs(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**MB, "zero_optimization": {"stage": 2}}))
    assert load_config(path, 2).stage == 2 and load_config(str(path), 2).train_batch_size == 8


def test_bad_json_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 4 "gradient_accumulation_steps": 1}')
    msg = error(path)
    assert str(path) in msg and "not valid JSON" in msg and "line 1" in msg


def test_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    msg = error(str(path))
    assert str(path) in msg and "does not exist" in msg


def test_path_with_a_nul_byte():
    assert "NUL byte" in error("ds_config.json\0")


def test_duplicate_key_in_file(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 4, "train_micro_batch_size_per_gpu": 8}')
    assert "twice" in error(path)


def test_non_mapping_configs():
    assert "config must be" in error([1, 2])
    assert "config must be" in error(42)


def test_user_dict_is_not_mutated():
    raw = {
        **MB,
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}},
        "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": True},
        "bfloat16": {"enabled": True},
    }
    before = copy.deepcopy(raw)
    load_config(raw, 2, auto={"learning_rate": 1.0})
    assert raw == before

"""Every problem of a config in one line: unknown keys, bad values, contradictions and unfilled "auto" values together,
without follow-up noise from a key that was itself bad."""

from __future__ import annotations

import pytest
from config_helpers import MB, error

from zero_core import ConfigError, load_config


def test_three_kinds_of_problem_are_all_named():
    msg = error(
        {
            **MB,
            "zero_optimization": {"stgae": 2},
            "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
            "fp16": {"enabled": True},
            "bf16": {"enabled": True},
        }
    )
    assert msg == (
        "config has 3 problems: (1) unknown key 'zero_optimization.stgae'; did you mean 'stage'? | "
        "(2) optimizer.params.lr cannot be 'auto' without learning_rate (auto={\"learning_rate\": ...}); set a "
        "number such as 1e-4 | (3) fp16.enabled and bf16.enabled are both true; enable only one of them"
    )


def test_errors_behind_a_failing_section_check_are_found_too():
    msg = error({**MB, "bf16": {"enabled": True}, "bfloat16": {"enabled": True}, "zero_optimization": {"stage": 9}})
    assert msg == (
        "config has 2 problems: (1) both 'bf16' and its legacy alias 'bfloat16' are set; keep only 'bf16' | "
        "(2) zero_optimization.stage must be an integer 0-3, got 9; set it to an integer 0-3"
    )


def test_bad_values_unsupported_keys_and_batch_arithmetic_together():
    msg = error(
        {
            "train_batch_size": 12,
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 2,
            "fp16": {"enabled": "yes"},
            "amp": {},
        }
    )
    assert msg.startswith(
        "config has 3 problems: (1) fp16.enabled must be true or false, got 'yes'; write true or false | (2) key "
        "'amp' is not supported by zero_core; use 'fp16' or 'bf16' instead | (3) train_batch_size (12) must equal"
    )


def test_every_contradiction_of_a_section_is_named():
    msg = error(
        {
            **MB,
            "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "nvme", "ratio": 0, "buffer_count": 1}},
        }
    )
    assert msg.startswith("config has 4 problems: ")
    for needle in (
        "offload_optimizer needs stage 1, 2 or 3",
        "offload_optimizer.ratio must be a number > 0",
        "offload_optimizer.nvme_path is required",
        "buffer_count=1 is too small",
    ):
        assert needle in msg
    msg = error(
        {
            **MB,
            "fp16": 3,
            "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}},
            "aio": {"use_gds": True, "single_submit": True},
        }
    )
    assert msg.startswith("config has 4 problems: (1) fp16 must be an object")
    assert "offload_param.nvme_path is required" in msg
    assert "aio.use_gds=true" in msg and "aio.single_submit=true" in msg


def test_a_bad_key_brings_no_follow_up_problems():
    # a bad stage is not read as stage 0 (which would contradict the offload)
    assert (
        error({**MB, "zero_optimization": {"stage": "two", "offload_optimizer": {"device": "cpu"}}})
        == "zero_optimization.stage must be an integer 0-3, got 'two'; set it to an integer 0-3"
    )
    # a misspelled required key is named once, as the typo
    assert error({**MB, "optimizer": {"typ": "AdamW"}}) == "unknown key 'optimizer.typ'; did you mean 'type'?"
    # an unfilled "auto" is not also "required"
    assert error({**MB, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}}).startswith(
        "scheduler.params.total_num_steps cannot be 'auto' without max_steps"
    )
    # a bad batch size is not also "no batch size"
    assert error({"train_micro_batch_size_per_gpu": "4", "fp16": {"enabled": 1}}) == (
        "config has 2 problems: (1) train_micro_batch_size_per_gpu must be an integer >= 1 or null, got '4'; "
        "set it to an integer >= 1 or null | (2) fp16.enabled must be true or false, got 1; write true or false"
    )


def test_a_lacking_feature_alone_is_unsupported_not_a_mistake():
    from zero_core import UnsupportedFeature

    with pytest.raises(UnsupportedFeature, match="GPUDirect Storage"):
        load_config({"train_micro_batch_size_per_gpu": 1, "aio": {"use_gds": True}}, 1)
    with pytest.raises(ConfigError) as e:  # with a real mistake beside it, the config is simply wrong
        load_config({"train_micro_batch_size_per_gpu": 1, "aio": {"use_gds": True, "block_size": 3}}, 1)
    assert not isinstance(e.value, UnsupportedFeature) and "block_size" in str(e.value)

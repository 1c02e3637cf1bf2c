"""The strict DeepSpeed-style config: one-line errors, defaults, aliases (settings that contradict each other:
test_config_contradictions.py; fuzzing: test_config_fuzz.py)."""

from __future__ import annotations

import json

import pytest
import torch
from config_helpers import MB, SEEDS, TRAINER, error

from zero_core.config import ZeroConfig, describe, load_config
from zero_core.config_errors import ConfigError


# -- unknown keys ---------------------------------------------------------------------------------
def test_top_level_typo_suggests_the_key():
    msg = error({**MB, "zero_optimizaton": {"stage": 2}})
    assert msg == "unknown key 'zero_optimizaton'; did you mean 'zero_optimization'?"


def test_nested_typo_names_the_full_path():
    assert (
        error({**MB, "zero_optimization": {"stgae": 2}})
        == "unknown key 'zero_optimization.stgae'; did you mean 'stage'?"
    )


def test_deeply_nested_typo():
    msg = error({**MB, "zero_optimization": {"offload_optimizer": {"pin_memroy": True}}})
    assert "'zero_optimization.offload_optimizer.pin_memroy'" in msg and "did you mean 'pin_memory'?" in msg


def test_unknown_key_without_close_match_lists_valid_keys():
    msg = error({**MB, "fp16": {"zzz": 1}})
    assert "unknown key 'fp16.zzz'" in msg and "hysteresis" in msg and "min_loss_scale" in msg


@pytest.mark.parametrize(
    "config, needle",
    [
        ({**MB, "amp": {"enabled": True}}, "use 'fp16' or 'bf16'"),
        ({**MB, "optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}}, "'gradient_clipping'"),
    ],
)
def test_known_deepspeed_keys_we_lack_say_why(config, needle):
    msg = error(config)
    assert "not supported by zero_core" in msg and needle in msg


def test_key_in_the_wrong_section_says_where_it_belongs():
    msg = error({**MB, "round_robin_gradients": True})
    assert msg == (
        "unknown key 'round_robin_gradients'; it belongs under 'zero_optimization.round_robin_gradients', move it there"
    )


def test_non_string_key():
    assert "not a string" in error({**MB, "zero_optimization": {3: 1}})


# -- types and values -----------------------------------------------------------------------------
def test_wrong_type_message():
    assert (
        error({**MB, "zero_optimization": {"stage": "two"}})
        == "zero_optimization.stage must be an integer 0-3, got 'two'; set it to an integer 0-3"
    )


@pytest.mark.parametrize(
    "config, path",
    [
        ({**MB, "zero_optimization": {"stage": 2.0}}, "zero_optimization.stage"),
        ({**MB, "zero_optimization": {"stage": True}}, "zero_optimization.stage"),
        ({**MB, "zero_optimization": {"stage": 4}}, "zero_optimization.stage"),
        ({**MB, "optimizer": {"type": "AdamW", "params": {"lr": "1e-4"}}}, "optimizer.params.lr"),
        ({**MB, "optimizer": {"type": "AdamW", "params": {"lr": -1e-4}}}, "optimizer.params.lr"),
        ({**MB, "optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.0]}}}, "optimizer.params.betas"),
        ({**MB, "optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}}, "optimizer.params.betas"),
        ({**MB, "optimizer": {"type": "AdamW", "params": {"eps": 0}}}, "optimizer.params.eps"),
        (
            {**MB, "optimizer": {"type": "AdamW", "params": {"weight_decay": float("nan")}}},
            "optimizer.params.weight_decay",
        ),
        ({**MB, "gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
        ({"train_micro_batch_size_per_gpu": "4"}, "train_micro_batch_size_per_gpu"),
        ({**MB, "zero_optimization": {"reduce_bucket_size": 5.5}}, "zero_optimization.reduce_bucket_size"),
        ({**MB, "zero_optimization": {"reduce_bucket_size": -1}}, "zero_optimization.reduce_bucket_size"),
        ({**MB, "fp16": {"enabled": "yes"}}, "fp16.enabled"),
        ({**MB, "fp16": {"hysteresis": 0}}, "fp16.hysteresis"),
        ({**MB, "fp16": {"min_loss_scale": 0}}, "fp16.min_loss_scale"),
        ({**MB, "gradient_clipping": -1.0}, "gradient_clipping"),
        ({**MB, "communication_data_type": "int8"}, "communication_data_type"),
        (
            {**MB, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}},
            "scheduler.params.warmup_type",
        ),
        ({**MB, "zero_optimization": 2}, "zero_optimization must be an object"),
        ({**MB, "optimizer": {"params": {}}}, "optimizer.type is required"),
    ],
)
def test_bad_values_name_the_path(config, path):
    msg = error(config)
    assert msg.startswith(path), msg


def test_unknown_optimizer_lists_supported():
    msg = error({**MB, "optimizer": {"type": "Lamb"}})
    assert "optimizer.type" in msg and "'AdamW'" in msg and "'Adam'" in msg and "'Lamb'" in msg
    assert "problems" not in msg and "is required" not in msg  # one problem: the type given, not a missing one


def test_unknown_scheduler_lists_supported():
    msg = error({**MB, "scheduler": {"type": "CyclicLR"}})
    assert "scheduler.type" in msg and all(
        f"'{k}'" in msg for k in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")
    )
    assert "is required" not in msg and "zero_core implements" in msg


def test_lenient_where_deepspeed_is():
    cfg = load_config(
        {
            **MB,
            "gradient_clipping": 1,
            "fp16": {"enabled": "true", "loss_scale": 128},
            "zero_optimization": {"reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8},
        },
        1,
    )
    assert cfg.gradient_clipping == 1.0 and isinstance(cfg.gradient_clipping, float)
    assert cfg.fp16.enabled is True and cfg.fp16.loss_scale == 128.0
    assert cfg.zero_optimization.reduce_bucket_size == 500_000_000
    assert type(cfg.zero_optimization.allgather_bucket_size) is int


# -- defaults, "auto", aliases, properties --------------------------------------------------------
def test_defaults_follow_deepspeed():
    cfg = load_config(MB, 1)
    z = cfg.zero_optimization
    assert (z.stage, z.overlap_comm, z.contiguous_gradients, z.reduce_scatter) == (0, False, True, True)
    assert (z.reduce_bucket_size, z.allgather_bucket_size) == (500_000_000, 500_000_000)
    assert (z.stage3_prefetch_bucket_size, z.stage3_param_persistence_threshold) == (50_000_000, 100_000)
    assert cfg.fp16.initial_scale_power == 16 and cfg.fp16.loss_scale_window == 1000 and cfg.fp16.hysteresis == 2
    assert cfg.optimizer.type == "AdamW" and cfg.optimizer.params.lr == 1e-3  # our documented default
    assert cfg.optimizer.params.betas == (0.9, 0.999) and cfg.optimizer.params.weight_decay == 0.0
    assert cfg.scheduler is None and cfg.gradient_clipping == 1.0  # DeepSpeed 0.19's default


def test_overlap_comm_default_depends_on_stage():
    assert load_config({**MB, "zero_optimization": {"stage": 3}}, 1).zero_optimization.overlap_comm is True
    assert load_config({**MB, "zero_optimization": {"stage": 2}}, 1).zero_optimization.overlap_comm is False
    cfg = load_config({**MB, "zero_optimization": {"stage": 3, "overlap_comm": False}}, 1)
    assert cfg.zero_optimization.overlap_comm is False


def test_optimizer_modes():
    adam = load_config({**MB, "optimizer": {"type": "ADAM"}}, 1).optimizer
    assert adam.type == "Adam" and adam.decoupled  # DeepSpeed: adam_w_mode defaults to True
    l2 = load_config({**MB, "optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}}, 1).optimizer
    assert not l2.decoupled
    torch_adamw = load_config({**MB, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}, 1).optimizer
    assert torch_adamw.params.weight_decay == 0.01  # torch.optim.AdamW's default
    for spelled in ({"torch_adam": "true"}, {"torch_adam": " True ", "adam_w_mode": "true"}):  # "true" is true
        cfg = load_config({**MB, "optimizer": {"type": "Adam", "params": spelled}}, 1).optimizer
        assert cfg.params.weight_decay == 0.01 and cfg.decoupled
    l2_torch = {"torch_adam": "true", "adam_w_mode": "false"}  # torch.optim.Adam: no decoupled decay to default
    assert load_config({**MB, "optimizer": {"type": "Adam", "params": l2_torch}}, 1).optimizer.params.weight_decay == 0


def test_hostile_configs_are_one_line(tmp_path):
    """A number too long to print, nesting past the stack, a FIFO or an oversized file: one ConfigError line each,
    never a traceback or a hang."""
    import os

    from zero_core.config import read_config_file

    cases = {
        "a huge integer": ({**MB, "zero_optimization": {"stage": 10**5000}}, "an integer of 16610 bits"),
        "deep nesting": ({**MB, "wandb": __import__("functools").reduce(lambda d, _: {"a": d}, range(600), {})},
                         "nested more than 64 levels"),
    }
    for name, (cfg, expected) in cases.items():
        with pytest.raises(ConfigError, match=expected) as e:
            load_config(cfg, 1)
        assert "\n" not in str(e.value), name
    (tmp_path / "big.json").write_text('{"train_micro_batch_size_per_gpu": ' + "9" * 5000 + "}")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(tmp_path / "fifo")
    with open(tmp_path / "huge.json", "wb") as f:
        f.truncate((16 << 20) + 1)
    for name, expected in (("big.json", "number too long"), ("deep.json", "nested too deeply"),
                           ("fifo", "not a regular file"), ("huge.json", "larger than")):
        with pytest.raises(ConfigError, match=expected):
            read_config_file(str(tmp_path / name))


def test_legacy_aliases():
    cfg = load_config(
        {
            **MB,
            "bfloat16": {"enabled": True},
            "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": True},
        },
        1,
    )
    assert cfg.bf16.enabled and cfg.zero_optimization.stage3_gather_16bit_weights_on_model_save
    # DeepSpeed's own field names beside their stage3_ aliases
    names = {"prefetch_bucket_size": 123, "param_persistence_threshold": 45, "max_live_parameters": 6789,
             "max_reuse_distance": 10, "gather_16bit_weights_on_model_save": True}
    zero = load_config({**MB, "zero_optimization": {"stage": 3, **names}}, 1).zero_optimization
    assert all(getattr(zero, f"stage3_{k}") == v for k, v in names.items())
    with pytest.raises(ConfigError, match="disagree"):
        both = {"stage": 3, "max_reuse_distance": 1, "stage3_max_reuse_distance": 2}
        load_config({**MB, "zero_optimization": both}, 1)


def test_properties():
    fp16 = load_config({**MB, "fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}, 1)
    assert (fp16.stage, fp16.dtype, fp16.comm_dtype, fp16.dynamic_loss_scale) == (2, torch.float16, torch.float16, True)
    static = load_config({**MB, "fp16": {"enabled": True, "loss_scale": 1024}}, 1)
    assert not static.dynamic_loss_scale
    bf16 = load_config({**MB, "bf16": {"enabled": True}, "communication_data_type": "fp32"}, 1)
    assert (bf16.dtype, bf16.comm_dtype, bf16.dynamic_loss_scale) == (torch.bfloat16, torch.float32, False)
    fp32 = load_config(MB, 1)
    assert (fp32.dtype, fp32.comm_dtype) == (torch.float32, torch.float32)


def test_config_is_frozen():
    cfg = load_config(MB, 1)
    with pytest.raises(Exception):
        cfg.gradient_clipping = 2.0  # type: ignore[misc]


def test_describe_round_trips():
    cfg = load_config(json.loads((SEEDS / "000_zero2_config_accelerate.json").read_text()), 2, auto=TRAINER)
    text = describe(cfg)
    assert text == cfg.describe() and json.loads(text)["zero_optimization"]["reduce_bucket_size"] == 200_000_000
    assert load_config(json.loads(text), 2).model_dump() == cfg.model_dump()


def test_zero_config_is_revalidated_for_the_world_size():
    cfg = load_config({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 2)
    assert cfg.train_batch_size == 16
    assert load_config(cfg, 4).train_batch_size == 32  # derived again from what the user gave
    direct = ZeroConfig(train_batch_size=12, train_micro_batch_size_per_gpu=3)
    assert load_config(direct, 2).gradient_accumulation_steps == 2
    assert "4 * 1 * 2 = 8" in error(
        ZeroConfig(train_batch_size=12, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=1), 2
    )


def test_world_size_is_checked():
    with pytest.raises(ValueError):
        load_config(MB, 0)


def test_an_auto_nothing_fills_takes_deepspeeds_default():
    """DeepSpeed's config models drop an "auto" no trainer filled (HF configs write them under keys like
    overlap_comm): the key takes DeepSpeed's default, here as there; offload ratio "auto" keeps zero_core's meaning."""
    zero = {"stage": 3, "overlap_comm": "auto", "stage3_gather_16bit_weights_on_model_save": "auto",
            "offload_optimizer": {"device": "cpu", "pin_memory": "auto", "ratio": "auto"},
            "offload_param": {"device": "cpu", "pin_memory": "auto"}}
    cfg = load_config({**MB, "fp16": {"enabled": True, "loss_scale": "auto", "hysteresis": "auto"},
                       "zero_optimization": zero}, 1)
    z = cfg.zero_optimization
    assert z.overlap_comm is True and z.stage3_gather_16bit_weights_on_model_save is False  # stage 3's defaults
    assert z.offload_optimizer.ratio == "auto" and z.offload_optimizer.pin_memory is True  # DeepSpeed 0.19.8's
    assert (cfg.fp16.loss_scale, cfg.fp16.hysteresis) == (0.0, 2)
    two = load_config({**MB, "zero_optimization": {"stage": 2, "overlap_comm": "auto"}}, 1).zero_optimization
    assert two.overlap_comm is False
    assert load_config(json.loads(describe(cfg)), 1).model_dump() == cfg.model_dump()  # the printed config reloads

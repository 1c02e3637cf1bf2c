"""Every key DeepSpeed 0.19.8 accepts loads in zero_core at its default value, and a value that turns on something
zero_core does not do is refused in one line naming the key, the reason and the fix.

tests/data/deepspeed_0.19.8_every_key.json holds every key of DeepSpeed 0.19.8's config classes (runtime/config.py,
zero/config.py, zero/offload_config.py, precision_config.py, compile/config.py, the activation checkpointing,
monitor, profiler, aio, checkpoint and data_types readers) at its default value; DeepSpeedConfig accepts it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from config_helpers import error

from zero_core import ConfigError, load_config
from zero_core import config as config_module
from zero_core.config import describe
from zero_core.config_keys import BY_PATH, KEYS, REFUSED

EVERY_KEY = json.loads((Path(__file__).parent / "data" / "deepspeed_0.19.8_every_key.json").read_text())
MB = {"train_micro_batch_size_per_gpu": 2}
ADAMW = {"type": "AdamW", "params": {"lr": 1e-3}}


def _deepspeed_chat(stage: int = 3, dtype: str = "bf16", hybrid_engine: bool = False, lora: bool = False) -> dict:
    """What DeepSpeed-Chat's get_train_ds_config (dschat/utils/ds_utils.py) returns: 8 GPUs, micro-batch 4."""
    zero = {"stage": stage, "overlap_comm": True, "offload_param": {"device": "none"},
            "offload_optimizer": {"device": "none"}, "stage3_param_persistence_threshold": 1e4,
            "stage3_max_live_parameters": 3e7, "stage3_prefetch_bucket_size": 3e7, "memory_efficient_linear": False}
    if lora:
        zero["zero_quantized_nontrainable_weights"] = True
    precision = {"fp16": {"enabled": True, "loss_scale_window": 100}, "bf16": {"enabled": True}}[dtype]
    return {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
            "zero_optimization": zero, "bfloat16" if dtype == "bf16" else "fp16": precision,
            "gradient_clipping": 1.0, "prescale_gradients": False, "wall_clock_breakdown": False,
            "hybrid_engine": {"enabled": hybrid_engine, "max_out_tokens": 512, "inference_tp_size": 1,
                              "release_inference_cache": False, "pin_parameters": True, "tp_gather_partition_size": 8},
            "tensorboard": {"enabled": False, "output_path": "step3_tensorboard/ds_tensorboard_logs/",
                            "job_name": "step3_actor_tensorboard"}}


@pytest.fixture
def named(monkeypatch, capsys):
    """The keys the rank-0 line of load_config names."""
    monkeypatch.setattr(config_module, "_NAMED", set())

    def keys() -> list[str]:
        lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("zero_core: accepted, not acted on: ")]
        assert len(lines) <= 1
        return [entry.split(" (")[0] for entry in lines[0].split(": ", 1)[1].split("), ")] if lines else []

    return keys


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_deepspeed_chats_stage3_config_loads(named, dtype):
    cfg = load_config(_deepspeed_chat(dtype=dtype), 8)
    assert (cfg.stage, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (3, 4, 1)
    assert cfg.zero_optimization.stage3_param_persistence_threshold == 10_000 and cfg.dtype is not None
    said = named()
    assert "zero_optimization.memory_efficient_linear" in said and "hybrid_engine.max_out_tokens" in said
    assert "hybrid_engine.enabled" in said and "tensorboard" not in said  # a tensorboard section is acted on


@pytest.mark.parametrize(
    "kw, key",
    [({"hybrid_engine": True}, "hybrid_engine.enabled"),
     ({"lora": True}, "zero_optimization.zero_quantized_nontrainable_weights")],
)
def test_deepspeed_chats_features_zero_core_lacks_are_one_line(kw, key):
    msg = error(_deepspeed_chat(**kw), 8)
    assert msg.startswith(f"{key}=true is not supported by zero_core: ") and msg.endswith("; remove it or set false")


def test_every_deepspeed_key_at_its_default_loads(named):
    cfg = load_config(EVERY_KEY, 1)
    assert cfg.stage == 3 and cfg.optimizer.params.lr == 1e-3
    said = set(named())
    assert {"zero_optimization.zero_hpz_partition_size", "compile.deepcompile", "autotuning", "pipeline",
            "optimizer.params.amsgrad", "bf16.immediate_grad_update"} <= said
    assert load_config(json.loads(describe(cfg)), 1).model_dump() == cfg.model_dump()  # the printed config reloads
    assert not {"hybrid_engine", "compile", "autotuning"} & set(json.loads(describe(load_config(MB, 1))))  # unset


def _leaves(data: object, prefix: str = "") -> list[str]:
    if not isinstance(data, dict) or prefix[:-1] in BY_PATH:
        return [prefix[:-1]]
    return [leaf for key, value in data.items() for leaf in _leaves(value, f"{prefix}{key}.")]


def test_every_deepspeed_key_has_a_row():
    missing = [p for p in _leaves(EVERY_KEY) if p not in BY_PATH]
    assert not missing, f"classify these in zero_core/config_keys*.py: {missing}"


# keys real configs use (DeepSpeed-Chat and others) that were once refused as unknown, at those values
FOUND = {"dataloader_drop_last": False, "hybrid_engine": {"enabled": False, "max_out_tokens": 512},
         "zero_optimization.ignore_unused_parameters": True, "zero_optimization.load_from_fp32_weights": True,
         "zero_optimization.stage3_module_granularity_threshold": 0, "zero_optimization.zero_hpz_partition_size": 1,
         "zero_optimization.zero_quantized_weights": False, "zero_optimization.memory_efficient_linear": True,
         "zero_optimization.use_multi_rank_bucket_allreduce": True, "bf16.immediate_grad_update": True,
         "fp16.fp16_master_weights_and_grads": False, "torch_autocast": {"enabled": False},
         "seq_parallel_communication_data_type": "fp32", "compile": {"deepcompile": False},
         "optimizer.params.amsgrad": False, "optimizer.params.bias_correction": True, "optimizer.params.fused": True}


def _with(path: str, value: object) -> dict:
    config = {**MB, "zero_optimization": {"stage": 3}, "optimizer": json.loads(json.dumps(ADAMW))}
    *parents, name = path.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[name] = value
    return config


@pytest.mark.parametrize("path", sorted(FOUND))
def test_the_keys_found_refused_load(path):
    load_config(_with(path, FOUND[path]), 1)


# for each key accepted only where it changes nothing: a value that would change something
NON_DEFAULT = {
    "managed_gradient_accumulation": False, "sequence_parallel_size": 2, "gradient_allreduce_op": "sum",
    "optimizer.params.amsgrad": True, "optimizer.params.bias_correction": False,
    "optimizer.params.maximize": True, "optimizer.params.fp32_optimizer_states": False,
    "fp16.fp16_master_weights_and_grads": True, "bf16.check_grad_overflow": False,
    "bf16.bf16_master_weights_and_grads": True, "bf16.bf16_optimizer_states": True,
    "zero_optimization.load_from_fp32_weights": False, "zero_optimization.zenflow": {"topk_ratio": 0.1},
    "zero_optimization.zero_hpz_partition_size": 8, "zero_optimization.zero_quantized_weights": True,
    "zero_optimization.zero_quantized_nontrainable_weights": True, "zero_optimization.zero_quantized_gradients": True,
    "torch_autocast.enabled": True, "hybrid_engine.enabled": True, "compile.deepcompile": True,
    "compile.autoep_non_moe": True, "compile.passes": ["z3"],
    "autotuning": {"enabled": True},
    "data_efficiency": {"enabled": True}, "expert_parallel": {"enabled": True}, "tensor_parallel": {"autotp_size": 2},
    "datastates_ckpt": {"path": "/tmp"},
}
AIO = ("aio.",)  # their libaio messages: test_config_keys.py, test_host_offload.py
CHECKED = [k for k in KEYS if k.status == REFUSED and k.accepts and not k.path.startswith(AIO)]


def test_every_key_accepted_only_at_some_values_is_checked_here():
    assert sorted(NON_DEFAULT) == sorted(k.path for k in CHECKED)


@pytest.mark.parametrize("row", CHECKED, ids=lambda k: k.path)
def test_a_value_zero_core_does_not_do_is_refused_in_one_line(row):
    value = NON_DEFAULT[row.path]
    msg = error(_with(row.path, value), 1)
    where = f"{row.path}.{row.switch}" if row.switch else row.path
    assert msg.startswith(f"{where}=") and f"is not supported by zero_core: {row.why}; remove " in msg, msg
    accepted = json.dumps(row.accepts[0])
    assert msg.endswith(f"to {accepted}" if row.switch else f"or set {accepted}"), msg
    for ok in row.accepts:  # its default values load
        load_config(_with(row.path, {row.switch: ok} if row.switch else ok), 1)


def test_a_switch_anywhere_in_a_section_counts():
    """DeepSpeed reads data_efficiency's nested 'enabled' keys even with the section's own off."""
    nested = {"enabled": False, "data_routing": {"random_ltd": {"enabled": True}}}
    assert error({**MB, "data_efficiency": nested}, 1).startswith(
        "data_efficiency.data_routing.random_ltd.enabled=true is not supported by zero_core: ")
    load_config({**MB, "data_efficiency": {"enabled": False, "data_sampling": {"enabled": False, "num_epochs": 1}}}, 1)


def test_param_dtype_must_name_the_working_precision_and_buffer_dtype_may_name_any():
    bf16 = _with("bf16.enabled", True)
    load_config({**bf16, "data_types": {"param_dtype": "bfloat16", "buffer_dtype": "bf16", "grad_accum_dtype": "fp32"}},
                1)
    msg = error({**bf16, "data_types": {"param_dtype": "fp16"}}, 1)
    assert msg.startswith("data_types.param_dtype='fp16' is not the working precision 'bf16'")
    assert load_config({**MB, "data_types": {"buffer_dtype": "bf16"}}, 1).data_types.buffer_dtype == "bf16"


def test_deepspeeds_own_names_of_stage3_keys():
    z = load_config({**MB, "zero_optimization": {"module_granularity_threshold": 5, "allgather_sequential": True}},
                    1).zero_optimization
    assert (z.stage3_module_granularity_threshold, z.stage3_allgather_sequential) == (5, True)
    msg = error({**MB, "zero_optimization": {"model_persistence_threshold": 1,
                                             "stage3_model_persistence_threshold": 2}}, 1)
    assert "keep only 'stage3_model_persistence_threshold'" in msg


@pytest.mark.parametrize("config, want", [
    ({"compile": {"deepcompil": True}}, "unknown key 'compile.deepcompil'; did you mean 'deepcompile'?"),
    ({"memory_efficient_linear": False}, "unknown key 'memory_efficient_linear'; it belongs under "
                                         "'zero_optimization.memory_efficient_linear', move it there"),
    ({"pipeline_read": True}, "unknown key 'pipeline_read'; it belongs under "
                              "'zero_optimization.offload_optimizer.pipeline_read', move it there"),  # not 'pipeline'
    ({"compile": {"deepcompile": False}, "comet": {"enabled": False}, "compiel": {}},
     "unknown key 'compiel'; did you mean 'compile'?"),
    ({"gradient_accumulation_dtype": "fp32"}, "key 'gradient_accumulation_dtype' is not supported by zero_core; it is "
                                              "not a DeepSpeed key (DeepSpeed skips it unread); the accumulation dtype "
                                              "is data_types.grad_accum_dtype"),
    ({"zero_optimization": {"mics_shard_size": 8}}, "key 'zero_optimization.mics_shard_size' is not supported by "
                                                    "zero_core; DeepSpeed 0.19.8 removed it too; remove it"),
])
def test_unknown_keys_get_a_sensible_hint(config, want):
    assert error({**MB, **config}, 1) == want


def test_a_generic_name_in_the_wrong_place_lists_the_sections_keys():
    msg = error({**MB, "compile": {"enabled": True}}, 1)  # many sections have 'enabled': none is the answer
    assert msg.startswith("unknown key 'compile.enabled'; remove it or use one of the valid keys of 'compile': ")
    with pytest.raises(ConfigError, match="^unknown key 'mystery_key'; remove it"):
        load_config({**MB, "mystery_key": 1}, 1)


@pytest.mark.parametrize("form, stage", [(True, 1), (False, 0)])
def test_boolean_zero_optimization_is_read_as_deepspeed_reads_it(form, stage, capsys, monkeypatch):
    """DeepSpeed's first format: true is stage 1 with the top-level allgather_size as its bucket, false stage 0;
    rank 0 names the section to write instead."""
    monkeypatch.setattr(config_module, "_NAMED", set())
    cfg = load_config({**MB, "zero_optimization": form, "allgather_size": 12345}, world_size=2)
    assert cfg.stage == stage
    assert cfg.zero_optimization.allgather_bucket_size == (12345 if stage else 500_000_000)
    note = capsys.readouterr().err
    assert f'"zero_optimization": {str(form).lower()} is DeepSpeed\'s deprecated form' in note
    assert f'"stage": {stage}' in note


def test_allgather_size_beside_a_zero_section_is_an_unknown_key():
    assert "unknown key 'allgather_size'" in error({**MB, "zero_optimization": {"stage": 2}, "allgather_size": 1})



@pytest.mark.parametrize("old, new", [("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")])
def test_deprecated_offload_booleans_are_read_as_deepspeed_reads_them(old, new, capsys, monkeypatch):
    """DeepSpeed 0.19.8 reads false as no offload section ({"stage": 2, "cpu_offload": false} is its CIFAR example's)
    and true as the section with device "cpu", and refuses either beside that section; rank 0 names what it read."""
    monkeypatch.setattr(config_module, "_NAMED", set())
    stage = 2 if old == "cpu_offload" else 3
    assert getattr(load_config({**MB, "zero_optimization": {"stage": stage, old: False}}, 2).zero_optimization,
                   new) is None
    deprecated = {**MB, "zero_optimization": {"stage": stage, old: True}}
    cfg = load_config(deprecated, 2)
    load_config(deprecated, 2)  # named once
    section = {**MB, "zero_optimization": {"stage": stage, new: {"device": "cpu"}}}
    assert cfg.model_dump() == load_config(section, 2).model_dump()
    assert [line for line in capsys.readouterr().err.splitlines() if "deprecated form" in line] == [
        f"zero_core: zero_optimization.{old}: false is DeepSpeed's deprecated form, read as no {new}; remove it",
        f'zero_core: zero_optimization.{old}: true is DeepSpeed\'s deprecated form, read as "{new}": {{"device": '
        '"cpu"}; write it that way',
    ]
    for value in (True, False):
        msg = error({**MB, "zero_optimization": {"stage": stage, old: value, new: {"device": "cpu"}}}, 2)
        assert msg == (f"zero_optimization.{old} is DeepSpeed's deprecated form of {new}, and DeepSpeed refuses "
                       f"both together; keep only '{new}'")
    assert error({**MB, "zero_optimization": {"stage": stage, old: "yes"}}, 2).startswith(
        f"zero_optimization.{old} must be true or false")

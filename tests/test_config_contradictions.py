"""The strict DeepSpeed-style config: settings that contradict each other or the ZeRO stage are refused in one
line naming the key to change; combinations DeepSpeed allows are accepted (the rest: test_config.py)."""

from __future__ import annotations

from config_helpers import MB, error

from zero_core.config import load_config


# -- contradictions -------------------------------------------------------------------------------
def test_fp16_and_bf16_both_enabled():
    msg = error({**MB, "fp16": {"enabled": True}, "bf16": {"enabled": True}})
    assert "fp16.enabled" in msg and "bf16.enabled" in msg and "only one" in msg


def test_nvme_offload_of_optimizer_states_and_parameters():
    for section in ("offload_optimizer", "offload_param"):
        cfg = load_config(
            {**MB, "zero_optimization": {"stage": 3, section: {"device": "nvme", "nvme_path": "/tmp"}}}, 2
        )
        assert getattr(cfg.zero_optimization, section).nvme_path == "/tmp"
    msg = error({**MB, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})
    assert msg.startswith("zero_optimization.offload_param.nvme_path is required with device 'nvme'")


def test_cpu_offload_accepted_at_stages_1_to_3_only():
    for stage in (1, 2, 3):
        cfg = load_config({**MB, "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu"}}}, 2)
        assert cfg.zero_optimization.offload_optimizer.device == "cpu"
    msg = error({**MB, "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})
    assert "offload_optimizer needs stage 1, 2 or 3" in msg


def test_offload_param_needs_stage_3():
    msg = error({**MB, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    assert "zero_optimization.offload_param" in msg and "stage 3" in msg and "stage is 2" in msg
    load_config({**MB, "zero_optimization": {"stage": 2, "offload_param": {"device": "none"}}}, 2)


def test_stage3_keys_are_fine_at_other_stages():
    cfg = load_config({**MB, "zero_optimization": {"stage": 1, "stage3_max_live_parameters": 1e9}}, 2)
    assert cfg.stage == 1


def test_scheduler_total_steps_rules():
    assert "total_num_steps is required for WarmupDecayLR" in error({**MB, "scheduler": {"type": "WarmupDecayLR"}})
    msg = error({**MB, "scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}}})
    assert "scheduler.params.total_num_steps does not apply to WarmupLR" in msg


def test_adamw_with_adam_w_mode_false_is_a_contradiction():
    msg = error({**MB, "optimizer": {"type": "AdamW", "params": {"adam_w_mode": False}}})
    assert "optimizer.params.adam_w_mode" in msg and "'Adam'" in msg


def test_both_bf16_spellings():
    assert "'bfloat16'" in error({**MB, "bf16": {"enabled": True}, "bfloat16": {"enabled": True}})


def test_both_gather_spellings_disagree():
    msg = error(
        {
            **MB,
            "zero_optimization": {
                "stage3_gather_fp16_weights_on_model_save": True,
                "stage3_gather_16bit_weights_on_model_save": False,
            },
        }
    )
    assert "stage3_gather_16bit_weights_on_model_save" in msg

"""DeepSpeed's config getters on the engine (`engine.zero_sub_group_size()`, `engine.dynamic_loss_scale_args()`,
...) answer what DeepSpeed 0.19.8's answer for the same config; pipeline calls are refused in one line."""

from __future__ import annotations

import pytest
import torch

import zero_core.deepspeed as deepspeed

CONFIG = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
          "fp16": {"enabled": False, "initial_scale_power": 12, "loss_scale_window": 200, "hysteresis": 3,
                   "min_loss_scale": 2},
          "zero_optimization": {"stage": 3, "sub_group_size": 1000, "stage3_param_persistence_threshold": 10,
                                "stage3_prefetch_bucket_size": 123, "stage3_max_live_parameters": 456,
                                "stage3_max_reuse_distance": 789, "round_robin_gradients": True,
                                "offload_optimizer": {"device": "cpu"}},
          "aio": {"block_size": 262144, "queue_depth": 4},
          "memory_breakdown": False, "dataloader_drop_last": True, "zero_allow_untested_optimizer": True,
          "flops_profiler": {"enabled": True}, "checkpoint": {"load_universal": True}}

# DeepSpeed 0.19.8 on CPU, one rank, CONFIG on a torch.nn.Linear(4, 4): each getter's answer
DS_ANSWERS = {
    "zero_allgather_partitions": True, "zero_sub_group_size": 1000, "zero_elastic_checkpoint": False,
    "zero_load_from_fp32_weights": True, "zero_param_persistence_threshold": 10,
    "zero_model_persistence_threshold": 9223372036854775807, "zero_prefetch_bucket_size": 123,
    "zero_max_live_parameters": 456, "zero_max_reuse_distance": 789, "zero_module_granularity_threshold": 0,
    "zero_allgather_sequential": False, "zero_round_robin_gradients": True, "zero_ignore_unused_parameters": True,
    "zero_legacy_stage1": False, "zero_hpz_partition_size": 1, "zero_compute_grad_norm": True,
    "zero_multi_rank_bucket_allreduce": True, "zero_parameter_alignment": False, "zero_quantized_weights": False,
    "zero_quantized_nontrainable_weights": False, "zero_quantized_gradients": False,
    "zero_log_trace_cache_warnings": False, "is_sanity_checks_enabled": False, "zero_use_cpu_optimizer": True,
    "zero_nvme_offload_optimizer": False, "zero_partial_offload": 1.0, "zero_allow_untested_optimizer": True,
    "zero_force_ds_cpu_optimizer": True, "fp16_auto_cast": False, "fp16_master_weights_and_gradients": False,
    "bf16_master_weights_and_gradients": False, "bf16_optimizer_states": False, "initial_dynamic_scale": 4096,
    "dynamic_loss_scale_args": {"init_scale": 4096, "scale_window": 200, "delayed_shift": 3,
                                "consecutive_hysteresis": False, "min_scale": 2},
    "torch_autocast_enabled": False, "torch_autocast_dtype": None,
    "aio_config": {"block_size": 262144, "queue_depth": 4, "intra_op_parallelism": 1, "single_submit": False,
                   "overlap_events": True, "use_gds": False},
    "memory_breakdown": False, "dataloader_drop_last": True, "managed_gradient_accumulation": True,
    "optimizer_legacy_fusion": False, "load_universal_checkpoint": True, "use_node_local_storage": False,
    "checkpoint_serialization_enabled": True, "checkpoint_writer_enabled": False, "flops_profiler_enabled": True,
    "autotuning_enabled": False, "data_efficiency_enabled": False, "curriculum_learning_enabled": False,
    "data_sampling_enabled": False, "random_ltd_enabled": False,
}


@pytest.fixture(scope="module")
def engine():
    model = torch.nn.Linear(4, 4)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    yield engine
    engine.close()


def test_config_getters_answer_as_deepspeed_does(engine):
    answers = {name: getattr(engine, name)() for name in DS_ANSWERS}
    assert answers == DS_ANSWERS
    assert engine.gradient_average is True and engine.sequence_parallel_size == 1
    assert (engine.get_data_parallel_rank(), engine.get_model_parallel_rank()) == (0, 0)


def test_aio_defaults_without_the_section():
    model = torch.nn.Linear(4, 4)
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    assert engine.aio_config() == {**DS_ANSWERS["aio_config"], "block_size": 1048576, "queue_depth": 8}
    assert engine._config.aio_config == engine.aio_config()  # DeepSpeed's config object holds the same dict
    assert engine.zero_use_cpu_optimizer() is False and engine.flops_profiler_enabled() is False
    engine.close()


@pytest.mark.parametrize("call", ["train_batch", "eval_batch"])
def test_pipeline_batches_are_refused_in_one_line(engine, call):
    with pytest.raises(NotImplementedError) as e:
        getattr(engine, call)(iter([]))
    assert f"engine.{call}() (pipeline parallelism) is not supported by zero_core" in str(e.value)
    assert "\n" not in str(e.value)


def test_groups_answer_for_the_one_data_parallel_group():
    from zero_core.deepspeed.utils import groups

    # one process without a process group: a world of one, as deepspeed.comm answers there
    assert (groups.get_data_parallel_world_size(), groups._get_data_parallel_rank()) == (1, 0)
    assert groups.get_model_parallel_world_size() == 1 and groups._get_sequence_parallel_world_size() == 1
    with pytest.raises(AttributeError, match="it trains data-parallel only") as e:
        groups._get_expert_parallel_group("ep_size_2")
    assert "\n" not in str(e.value)

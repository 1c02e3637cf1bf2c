"""DeepSpeed engine getters that scripts call to read back a config value (`engine.zero_sub_group_size()`,
`engine.dynamic_loss_scale_args()`, ...): each answers what DeepSpeed 0.19.8's answers for the same config,
read from zero_core's validated config. Where zero_core lacks the feature (autotuning, data efficiency, torch
autocast, model parallelism) the getter says it is off, as DeepSpeed's does for a config without it."""

from __future__ import annotations

from typing import Any

_AIO_DEFAULTS = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                 "overlap_events": True, "use_gds": False}


def _enabled(section: Any) -> bool:
    """An opaque section's `enabled` flag (the sections zero_core carries through unread)."""
    return bool(section.get("enabled", False)) if isinstance(section, dict) else False


def wall_clock_on(config: Any) -> bool:
    """DeepSpeed's wall_clock_breakdown: the config's flag, or its flops_profiler section enabled (DeepSpeed's config
    turns the timers on for its profiler, so its engine times, prints and monitors the phases then too)."""
    return bool(config.wall_clock_breakdown) or _enabled(config.flops_profiler)


class ConfigGetters:
    """Mixed into the engine."""

    gradient_average = True  # DeepSpeed's engine averages gradients over the data-parallel ranks

    # -- ZeRO ------------------------------------------------------------------------------------------------------
    def _zero(self) -> Any:
        return self.config.zero_optimization

    def zero_offload_optimizer(self) -> Any:
        """The config's `zero_optimization.offload_optimizer` section (None without optimizer offload)."""
        return self.config.zero_optimization.offload_optimizer

    def zero_offload_param(self) -> Any:
        """The config's `zero_optimization.offload_param` section (None without parameter offload)."""
        return self.config.zero_optimization.offload_param

    def zero_cpu_offload(self) -> bool:
        off = self.zero_offload_optimizer()
        return off is not None and off.device == "cpu"

    def zero_optimization_partition_gradients(self) -> bool:
        return self.stage >= 2

    def zero_optimization_partition_weights(self) -> bool:
        return self.stage == 3

    def zero_reduce_scatter(self) -> bool:
        return bool(self.config.zero_optimization.reduce_scatter)

    def zero_overlap_comm(self) -> bool:
        return bool(self.config.zero_optimization.overlap_comm)

    def gradient_predivide_factor(self) -> float:
        return float(self.config.gradient_predivide_factor)

    def postscale_gradients(self) -> bool:
        return not self.config.prescale_gradients

    def dump_state(self) -> bool:
        return bool(self.config.dump_state)

    def checkpoint_tag_validation_enabled(self) -> bool:
        return self.config.checkpoint.tag_validation != "Ignore"

    def checkpoint_tag_validation_fail(self) -> bool:
        return self.config.checkpoint.tag_validation == "Fail"

    def amp_enabled(self) -> bool:
        return False  # the config's `amp` section is refused: fp16 / bf16 instead

    def sparse_gradients_enabled(self) -> bool:
        return False  # refused too: gradients are always dense

    def elasticity_enabled(self) -> bool:
        return False  # refused too: batch sizes are set explicitly

    def zero_allgather_partitions(self) -> bool:
        return bool(self._zero().allgather_partitions)

    def zero_sub_group_size(self) -> int:
        return int(self._zero().sub_group_size)

    def zero_elastic_checkpoint(self) -> bool:
        return bool(self._zero().elastic_checkpoint)

    def zero_load_from_fp32_weights(self) -> bool:
        return bool(self._zero().load_from_fp32_weights)

    def zero_param_persistence_threshold(self) -> int:
        return int(self._zero().stage3_param_persistence_threshold)

    def zero_model_persistence_threshold(self) -> int:
        return int(self._zero().stage3_model_persistence_threshold)

    def zero_prefetch_bucket_size(self) -> int:
        return int(self._zero().stage3_prefetch_bucket_size)

    def zero_max_live_parameters(self) -> int:
        return int(self._zero().stage3_max_live_parameters)

    def zero_max_reuse_distance(self) -> int:
        return int(self._zero().stage3_max_reuse_distance)

    def zero_module_granularity_threshold(self) -> int:
        return int(self._zero().stage3_module_granularity_threshold)

    def zero_allgather_sequential(self) -> bool:
        return bool(self._zero().stage3_allgather_sequential)

    def zero_round_robin_gradients(self) -> bool:
        return bool(self._zero().round_robin_gradients)

    def zero_ignore_unused_parameters(self) -> bool:
        return bool(self._zero().ignore_unused_parameters)

    def zero_legacy_stage1(self) -> bool:
        return bool(self._zero().legacy_stage1)

    def zero_hpz_partition_size(self) -> int:
        return int(self._zero().zero_hpz_partition_size)

    def zero_compute_grad_norm(self) -> bool:
        return bool(self._zero().compute_grad_norm)

    def zero_multi_rank_bucket_allreduce(self) -> bool:
        return bool(self._zero().use_multi_rank_bucket_allreduce)

    def zero_parameter_alignment(self) -> bool:
        return bool(self._zero().parameter_alignment)

    def zero_quantized_weights(self) -> bool:
        return bool(self._zero().zero_quantized_weights)

    def zero_quantized_nontrainable_weights(self) -> bool:
        return bool(self._zero().zero_quantized_nontrainable_weights)

    def zero_quantized_gradients(self) -> bool:
        return bool(self._zero().zero_quantized_gradients)

    def zero_log_trace_cache_warnings(self) -> bool:
        return bool(self._zero().log_trace_cache_warnings)

    def is_sanity_checks_enabled(self) -> bool:
        return bool(self._zero().enable_sanity_checks)

    def zero_use_cpu_optimizer(self) -> bool:
        """Optimizer offload to the host or NVMe (DeepSpeed then steps a CPU optimizer)."""
        off = self._zero().offload_optimizer
        return off is not None and off.device in ("cpu", "nvme")

    def zero_nvme_offload_optimizer(self) -> bool:
        off = self._zero().offload_optimizer
        return off is not None and off.device == "nvme"

    def zero_partial_offload(self) -> Any:
        ratio = getattr(self._zero().offload_optimizer, "ratio", 1.0)
        return ratio if isinstance(ratio, str) else float(ratio)  # zero_core's "auto" as given

    def zero_allow_untested_optimizer(self) -> bool:
        return bool(self.config.zero_allow_untested_optimizer)

    def zero_force_ds_cpu_optimizer(self) -> bool:
        return bool(self.config.zero_force_ds_cpu_optimizer)

    # -- precision -------------------------------------------------------------------------------------------------
    def fp16_auto_cast(self) -> bool:
        return bool(self.config.fp16.auto_cast)

    def fp16_master_weights_and_gradients(self) -> bool:
        return bool(self.config.fp16.fp16_master_weights_and_grads)

    def bf16_master_weights_and_gradients(self) -> bool:
        return bool(self.config.bf16.bf16_master_weights_and_grads)

    def bf16_optimizer_states(self) -> bool:
        return bool(self.config.bf16.bf16_optimizer_states)

    def initial_dynamic_scale(self) -> int:
        return 2 ** int(self.config.fp16.initial_scale_power)

    def dynamic_loss_scale_args(self) -> dict:
        """DeepSpeed's dict of the fp16 dynamic loss scale's settings (whether or not fp16 is on, as there)."""
        fp16 = self.config.fp16
        return {"init_scale": self.initial_dynamic_scale(), "scale_window": fp16.loss_scale_window,
                "delayed_shift": fp16.hysteresis, "consecutive_hysteresis": fp16.consecutive_hysteresis,
                "min_scale": fp16.min_loss_scale}

    def torch_autocast_enabled(self) -> bool:
        section = self.config.torch_autocast
        return bool(section is not None and section.enabled)

    def torch_autocast_dtype(self) -> Any:
        section = self.config.torch_autocast
        return None if section is None else section.dtype

    # -- other sections --------------------------------------------------------------------------------------------
    def aio_config(self) -> dict:
        """The `aio` section's libaio settings, DeepSpeed's defaults where it is absent."""
        aio = self.config.aio
        return {k: getattr(aio, k, v) for k, v in _AIO_DEFAULTS.items()} if aio is not None else dict(_AIO_DEFAULTS)

    def memory_breakdown(self) -> bool:
        return bool(self.config.memory_breakdown)

    def dataloader_drop_last(self) -> bool:
        return bool(self.config.dataloader_drop_last)

    def managed_gradient_accumulation(self) -> bool:
        return bool(self.config.managed_gradient_accumulation)

    def optimizer_legacy_fusion(self) -> bool:
        section = self.config.get("optimizer")
        return bool(section.get("legacy_fusion", False)) if isinstance(section, dict) else False

    def load_universal_checkpoint(self) -> bool:
        return bool(self.config.checkpoint.load_universal)

    def use_node_local_storage(self) -> bool:
        return bool(self.config.checkpoint.use_node_local_storage)

    def checkpoint_serialization_enabled(self) -> bool:
        return bool(self.config.checkpoint.checkpoint_serialization)

    def checkpoint_writer_enabled(self) -> bool:
        return self.config.checkpoint.writer is not None

    def flops_profiler_enabled(self) -> bool:
        """The section's flag, as DeepSpeed reports it (zero_core accepts the section and profiles nothing)."""
        return _enabled(self.config.flops_profiler)

    def autotuning_enabled(self) -> bool:
        return _enabled(self.config.autotuning)

    def data_efficiency_enabled(self) -> bool:
        return _enabled(self.config.data_efficiency)

    def curriculum_learning_enabled(self) -> bool:
        return False  # DeepSpeed's data-efficiency features are not provided (their sections turn nothing on)

    def data_sampling_enabled(self) -> bool:
        return False

    def random_ltd_enabled(self) -> bool:
        return False

    # -- parallelism: data-parallel only ---------------------------------------------------------------------------
    @property
    def sequence_parallel_size(self) -> int:
        return int(self.config.sequence_parallel_size)

    def get_data_parallel_rank(self) -> int:
        return self.rank

    def get_model_parallel_rank(self) -> int:
        return 0

    def get_tensor_parallel_rank(self) -> int:
        return 0

    @staticmethod
    def is_map_style_dataset(obj: Any) -> bool:
        return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")

    @staticmethod
    def is_iterable_style_dataset(obj: Any) -> bool:
        import torch

        return isinstance(obj, torch.utils.data.IterableDataset)

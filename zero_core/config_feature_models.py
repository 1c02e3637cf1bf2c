"""Sections of DeepSpeed features zero_core lacks or does its own way: read with DeepSpeed's keys and defaults so
that a config keeps them, and checked so that one turning such a feature on is refused (config_keys_deepspeed.py).

Defaults are DeepSpeed 0.19.8's (runtime/config.py HybridEngineConfig, compile/config.py,
activation_checkpointing/config.py, runtime/constants.py for torch_autocast and data_types).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import PlainValidator

from .config_errors import leaf_error
from .config_types import Bool, Count, Dtype, Names, Section, integer


class TorchAutocastConfig(Section):
    enabled: Bool = False
    dtype: Dtype = None
    lower_precision_safe_modules: Names = None


class HybridEngineConfig(Section):
    """DeepSpeed-Chat's hybrid engine (training plus inference kernels for generation); zero_core lacks it."""

    enabled: Bool = False
    max_out_tokens: Annotated[int, integer(1)] = 512
    inference_tp_size: Annotated[int, integer(1)] = 1
    release_inference_cache: Bool = False
    pin_parameters: Bool = True
    tp_gather_partition_size: Annotated[int, integer(1)] = 8
    enable_cuda_graph: Bool = False


class CompileConfig(Section):
    """DeepCompile's options; zero_core lacks DeepCompile, so only its off state loads."""

    deepcompile: Bool = False
    autoep_non_moe: Bool = False
    free_activation: Bool = False
    free_activation_threshold: Count = 10 * 1024 * 1024
    offload_activation: Bool = False
    offload_activation_pin_memory: Bool = True
    offload_opt_states: Bool = False
    double_buffer: Bool = True
    symmetric_memory: Bool = False
    debug_log: Bool = False
    offload_parameters: Bool = False
    sync_before_reduce: Bool = False
    sync_after_reduce: Bool = False
    sync_before_allgather: Bool = False
    sync_after_allgather: Bool = False
    keep_int_input_tensors: Bool = True
    keep_all_input_tensors: Bool = False
    passes: Names = None


class ActivationCheckpointingConfig(Section):
    """Options of deepspeed.checkpointing; zero_core's recomputes through torch.utils.checkpoint."""

    partition_activations: Bool = False
    contiguous_memory_optimization: Bool = False
    cpu_checkpointing: Bool = False
    number_checkpoints: Annotated[int | None, integer(0, optional=True)] = None
    synchronize_checkpoint_boundary: Bool = False
    profile: Bool = False


def _auto_or_names(v: Any) -> str | list[str]:
    if (isinstance(v, str) and v == "auto") or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        return v
    raise leaf_error('"auto" or a list of name patterns', v)


class DataTypesConfig(Section):
    grad_accum_dtype: Dtype = None
    param_dtype: Dtype = None
    buffer_dtype: Dtype = None
    keep_in_fp32_modules: Annotated[str | list[str], PlainValidator(_auto_or_names)] = "auto"

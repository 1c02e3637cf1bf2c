"""`deepspeed.runtime.zero.stage3`'s memory estimators for ZeRO-3 (estimators.py)."""

from __future__ import annotations

import torch

from .... import memory_estimate as est
from ...refused import refusing_getattr
from .estimators import model_counts, print_table

_OWN_OPTIMIZER = "zero_core's engine shards the optimizer itself; ask engine.zero_optimization_stage() instead"
__getattr__ = refusing_getattr(__name__, {"DeepSpeedZeroOptimizer_Stage3": _OWN_OPTIMIZER})


def estimate_zero3_model_states_mem_needs(total_params: int, largest_layer_params: int, num_gpus_per_node: int = 1,
                                          num_nodes: int = 1, cpu_offload: bool = True, cpu_offload_params: bool = True,
                                          zero_init: bool = True,
                                          additional_buffer_factor: float = 1.5) -> tuple[int, int, int]:
    """(CPU bytes, GPU bytes, largest layer's bytes) of one setup, as DeepSpeed returns them."""
    cpu, gpu = est.zero3_bytes(total_params, largest_layer_params, num_gpus_per_node, num_nodes, cpu_offload,
                               cpu_offload_params, zero_init, additional_buffer_factor)
    return cpu, gpu, 4 * largest_layer_params


def estimate_zero3_model_states_mem_needs_all_live(model: torch.nn.Module, num_gpus_per_node: int = 1,
                                                   num_nodes: int = 1, additional_buffer_factor: float = 1.5) -> None:
    total, largest = model_counts(model)
    print_table((3,), total, largest, num_gpus_per_node, num_nodes, additional_buffer_factor)


def estimate_zero3_model_states_mem_needs_all_cold(total_params: int, largest_layer_params: int,
                                                   num_gpus_per_node: int = 1, num_nodes: int = 1,
                                                   additional_buffer_factor: float = 1.5) -> None:
    print_table((3,), total_params, largest_layer_params, num_gpus_per_node, num_nodes, additional_buffer_factor)

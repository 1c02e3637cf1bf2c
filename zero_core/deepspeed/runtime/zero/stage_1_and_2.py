"""`deepspeed.runtime.zero.stage_1_and_2`'s memory estimators for ZeRO-1 and ZeRO-2 (estimators.py; DeepSpeed
counts stage 1 as stage 2)."""

from __future__ import annotations

import torch

from .... import memory_estimate as est
from ...refused import refusing_getattr
from .estimators import model_counts, print_table

_OWN_OPTIMIZER = "zero_core's engine shards the optimizer itself; ask engine.zero_optimization_stage() instead"
__getattr__ = refusing_getattr(__name__, {"DeepSpeedZeroOptimizer": _OWN_OPTIMIZER})


def estimate_zero2_model_states_mem_needs(total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                                          cpu_offload: bool = True,
                                          additional_buffer_factor: float = 1.5) -> tuple[int, int]:
    """(CPU bytes, GPU bytes) of one setup, as DeepSpeed returns them."""
    return est.zero2_bytes(total_params, num_gpus_per_node, num_nodes, cpu_offload, additional_buffer_factor)


def estimate_zero2_model_states_mem_needs_all_live(model: torch.nn.Module, num_gpus_per_node: int = 1,
                                                   num_nodes: int = 1, additional_buffer_factor: float = 1.5) -> None:
    total, largest = model_counts(model)
    print_table((2,), total, largest, num_gpus_per_node, num_nodes, additional_buffer_factor)


def estimate_zero2_model_states_mem_needs_all_cold(total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                                                   additional_buffer_factor: float = 1.5) -> None:
    print_table((2,), total_params, 0, num_gpus_per_node, num_nodes, additional_buffer_factor)

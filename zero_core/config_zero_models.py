"""The "zero_optimization" section of the config, its offload sections and the top-level "aio": DeepSpeed's keys and
defaults.

Defaults are DeepSpeed 0.19.8's (runtime/zero/config.py, zero/offload_config.py, swap_tensor/aio_config.py).
What each key does is in config_keys.py; many are accepted and not acted on, or refused unless off.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

from pydantic import PrivateAttr, model_validator

from .config_errors import full_error
from .config_keys import ZERO_ALIASES
from .config_types import (Bool, Count, Opaque, OptionalBool, Section, Text, as_bool, choice, integer, number,
                           ratio_or_auto)

_DEVICES = choice({"none": "none", "cpu": "cpu", "nvme": "nvme"})
# DeepSpeed's deprecated booleans and the sections they stand for (runtime/zero/config.py, 0.19.8): true is the
# section with device "cpu", false none; DeepSpeed refuses one beside its section, whatever its value
_OFFLOAD_BOOLEANS = {"cpu_offload": "offload_optimizer", "cpu_offload_param": "offload_param"}


class OffloadOptimizerConfig(Section):
    device: Annotated[str, _DEVICES] = "none"
    pin_memory: Bool = True
    nvme_path: Text = None
    buffer_count: Annotated[int, integer(0)] = 4
    fast_init: Bool = False
    # the fraction of each rank's optimizer partition on the host (the rest on the device, optim/split_adam.py);
    # "auto": the largest device share that fits after a measured first step (optim/auto_ratio.py)
    ratio: Annotated[float | str, ratio_or_auto()] = 1.0
    pipeline_read: Bool = False
    pipeline_write: Bool = False
    super_offload: Bool = False
    cpuadam_cores_perc: Annotated[float, number(0.0, 1.0)] = 0.8


class OffloadParamConfig(Section):
    device: Annotated[str, _DEVICES] = "none"
    pin_memory: Bool = True
    nvme_path: Text = None
    buffer_count: Annotated[int, integer(0)] = 5
    buffer_size: Count = 100_000_000
    max_in_cpu: Count = 1_000_000_000


class AioConfig(Section):
    """Async I/O for NVMe optimizer offload, at the top level, where DeepSpeed reads it (its zero_optimization
    model refuses an "aio" key, and so does zero_core). Used: block_size (bytes per request, a multiple of
    4096), queue_depth x thread_count (requests in flight, each on a pool thread). single_submit, overlap_events
    and intra_op_parallelism are libaio settings: accepted at DeepSpeed's defaults only; use_gds is refused."""

    block_size: Count = 1_048_576
    queue_depth: Annotated[int, integer(1)] = 8
    thread_count: Annotated[int, integer(1)] = 1
    intra_op_parallelism: Annotated[int, integer(1)] = 1
    single_submit: Bool = False
    overlap_events: Bool = True
    use_gds: Bool = False


class ZeroOptimizationConfig(Section):
    stage: Annotated[int, integer(0, 3)] = 0
    overlap_comm: Bool = False  # absent -> stage == 3, as DeepSpeed
    contiguous_gradients: Bool = True
    reduce_scatter: Bool = True
    reduce_bucket_size: Annotated[int, integer(1, counts=True)] = 500_000_000  # DeepSpeed refuses 0 too
    allgather_partitions: Bool = True
    allgather_bucket_size: Count = 500_000_000
    stage3_prefetch_bucket_size: Count = 50_000_000
    stage3_param_persistence_threshold: Count = 100_000
    stage3_max_live_parameters: Count = 1_000_000_000
    stage3_max_reuse_distance: Count = 1_000_000_000
    stage3_gather_16bit_weights_on_model_save: Bool = False
    sub_group_size: Count = 1_000_000_000
    round_robin_gradients: Bool = False
    offload_optimizer: OffloadOptimizerConfig | None = None
    offload_param: OffloadParamConfig | None = None
    # read as the offload sections by _deprecated_offload_booleans; left set only at null, which changes nothing
    cpu_offload: OptionalBool = None
    cpu_offload_param: OptionalBool = None
    # DeepSpeed's keys of features zero_core lacks or does its own way (config_keys_deepspeed.py)
    use_multi_rank_bucket_allreduce: Bool = True
    compute_grad_norm: Bool = True
    load_from_fp32_weights: Bool = True
    elastic_checkpoint: Bool = False
    zenflow: Opaque = None
    cpu_offload_use_pin_memory: OptionalBool = None
    stage3_model_persistence_threshold: Count = sys.maxsize
    stage3_module_granularity_threshold: Count = 0
    stage3_allgather_sequential: Bool = False
    leaf_module: Opaque = None
    stage3_use_all_reduce_for_fetch_params: Bool = False
    ignore_unused_parameters: Bool = True
    legacy_stage1: Bool = False
    parameter_alignment: Bool = False
    zero_hpz_partition_size: Annotated[int, integer(0)] = 1
    zero_quantized_weights: Bool = False
    zero_quantized_nontrainable_weights: Bool = False
    zero_quantized_gradients: Bool = False
    memory_efficient_linear: Bool = True
    pipeline_loading_checkpoint: Bool = False
    override_module_apply: Bool = True
    log_trace_cache_warnings: Bool = False
    enable_sanity_checks: Bool = False
    save_muon_momentum_buffer_in_memory: Bool = False
    _deprecated_form: str | None = PrivateAttr(default=None)  # a note on the deprecated keys read (config.py prints it)

    @model_validator(mode="wrap")
    @classmethod
    def _deprecated_offload_booleans(cls, data: Any, handler: Any) -> Any:
        given = {k: as_bool(data[k]) for k in _OFFLOAD_BOOLEANS if isinstance(data, dict) and k in data}
        read = {k: on for k, on in given.items() if on is not None}  # anything else: the field's own error
        if not read:
            return handler(data)
        data = {k: v for k, v in data.items() if k not in read}
        notes = []
        for old, on in read.items():
            new = _OFFLOAD_BOOLEANS[old]
            if new in data:
                raise full_error(f"zero_optimization.{old} is DeepSpeed's deprecated form of {new}, and DeepSpeed "
                                 f"refuses both together; keep only '{new}'", drop=old)
            if on:
                data[new] = {"device": "cpu"}
            notes.append(f"zero_optimization.{old}: {str(on).lower()} is DeepSpeed's deprecated form, read as "
                         + (f'"{new}": {{"device": "cpu"}}; write it that way' if on else f"no {new}; remove it"))
        section = handler(data)
        section._deprecated_form = "; ".join(notes)
        return section

    @model_validator(mode="before")
    @classmethod
    def _aliases_and_dynamic_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in ZERO_ALIASES.items():
            if old in data:
                if new in data and data[new] != data[old]:
                    raise full_error(
                        f"zero_optimization.{old} (another name of it) and zero_optimization.{new} disagree; keep "
                        f"only '{new}'",
                        drop=old,
                    )
                data[new] = data.pop(old)
        if "overlap_comm" in data and data["overlap_comm"] is None:  # DeepSpeed's "decide by the stage", as absent
            del data["overlap_comm"]
        unset = data.get("overlap_comm", "auto") == "auto"  # absent, or an "auto" nothing filled
        if unset and data.get("stage") in (0, 1, 2, 3) and not isinstance(data.get("stage"), bool):
            data["overlap_comm"] = data["stage"] == 3
        return data

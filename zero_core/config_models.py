"""The typed config: pydantic models whose field names are DeepSpeed's JSON keys.

Defaults are DeepSpeed's (deepspeed/runtime/config.py, zero/config.py, zero/offload_config.py,
precision_config.py) unless a comment says otherwise. Every section forbids unknown keys. "auto" is
filled before these models see the config (config_auto.py); what each key does is in config_keys.py.
Cross-field checks and the batch-size arithmetic live in `config.py`, which needs the world size; the
optimizer and scheduler sections in `config_optimizer_models.py`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import torch
from pydantic import PrivateAttr, model_validator

from .config_errors import full_error
from .config_feature_models import (
    ActivationCheckpointingConfig,
    CompileConfig,
    DataTypesConfig,
    HybridEngineConfig,
    TorchAutocastConfig,
)
from .config_optimizer_models import SCHEDULER_KEYS, OptimizerConfig, SchedulerConfig, SchedulerParams  # noqa: F401
from .config_types import Bool, Opaque, Section, choice, integer, number
from .config_zero_models import (  # noqa: F401 (the sections' home for the rest of zero_core)
    AioConfig,
    OffloadOptimizerConfig,
    OffloadParamConfig,
    ZeroOptimizationConfig,
)


_DTYPE_NAMES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class FP16Config(Section):
    enabled: Bool = False
    auto_cast: Bool = False
    loss_scale: Annotated[float, number(0.0)] = 0.0  # 0 = dynamic
    initial_scale_power: Annotated[int, integer(0, 127)] = 16  # the scale is an fp32: 2**127 is its limit
    loss_scale_window: Annotated[int, integer(1)] = 1000
    hysteresis: Annotated[int, integer(1)] = 2
    consecutive_hysteresis: Bool = False
    min_loss_scale: Annotated[float, number(0.0, lo_open=True)] = 1.0
    fp16_master_weights_and_grads: Bool = False


class BF16Config(Section):
    enabled: Bool = False
    immediate_grad_update: Bool = False
    check_grad_overflow: Bool = True
    bf16_master_weights_and_grads: Bool = False
    bf16_optimizer_states: Bool = False


class CheckpointConfig(Section):
    tag_validation: Annotated[str, choice({"ignore": "Ignore", "warn": "Warn", "fail": "Fail"})] = "Warn"
    load_universal: Bool = False
    use_node_local_storage: Bool = False
    parallel_write: Opaque = None
    checkpoint_serialization: Bool = True
    writer: Opaque = None


class ZeroCoreConfig(Section):
    """zero_core's own keys, in a section of their own: DeepSpeed has no such keys and ignores the section."""

    # seconds a collective waits for the other ranks before failing with a CollectiveTimeout naming it;
    # None keeps the process group's timeout (torch's defaults: 30 min on gloo, 10 min on NCCL)
    comm_timeout_s: Annotated[float | None, number(0.0, lo_open=True, optional=True)] = None
    # stop with NonFiniteError after this many consecutive optimizer steps with NaN/inf gradients
    # (each one skipped and counted); 0 never stops, as DeepSpeed
    max_consecutive_nonfinite: Annotated[int, integer(0)] = 0
    # stages 1-2: each bucket's weight all-gather starts right after its update and is waited for only by the
    # modules that read it (stages/deferred_gather.py); with optimizer offload (stages 1-3) the host update itself
    # runs on after step() returns, the next forward waiting per module (stages/host_step_overlap.py). Off by
    # default: until that forward the model's weights are partly old, and a loop that reads them after step()
    # (an EMA, a weight log) would read wrong values, as it never does under DeepSpeed. zbench run turns it on:
    # its loop reads weights only through a forward or after wait_for_weights()
    overlap_weight_gather: Bool = False
    # save_checkpoint() returns once the state is copied into reusable host buffers; writing, checksums,
    # fsync and the atomic commit go on in a background thread (engine.wait_for_checkpoint())
    async_checkpoint: Bool = False
    # stage 3 without offload: all-gather each unit from its fp32 master shard, cast on the way (as FSDP2
    # does), instead of keeping a 16-bit copy of the partition (2 bytes per element of it). GPT-2 XL on 2x
    # H200: -1.46 GiB per GPU for 0.7% of speed (docs/benchmarks/2026-11-23_h200x2_gpt2xl_engines_final.md)
    stage3_gather_from_master: Bool = True
    # optimizer offload: the fraction of the host share whose AdamW may start during backward, as soon as
    # each bucket's gradient is final, undone and redone at the step when clipping or a non-finite
    # gradient says so (bitwise the same result; 12 bytes of host memory per such element for the copies,
    # lowered at the first step to what the host has left)
    overlap_host_update: Annotated[float, number(0.0, 1.0)] = 0.0
    # optimizer offload: the ZeRO-Offload paper's one-step delayed update (step N's forward runs on update
    # N-2's weights while update N-1 runs on the host). CHANGES NUMERICS; off by default (optim/delayed_update.py)
    offload_delayed_update: Bool = False
    # optimizer offload to NVMe: the fraction of the offloaded share whose states stay in host memory (the
    # part right after the GPU's share, in forward order); the rest goes to NVMe. 0 (DeepSpeed's layout): all
    # of it on NVMe. GPU, host memory and disk together then bound the largest model (optim/__init__.py)
    nvme_host_ratio: Annotated[float, number(0.0, 1.0, hi_open=True)] = 0.0
    # optimizer offload to host memory: the fraction of the host share (chunks spread evenly through it) whose
    # states stay in host memory but are updated on the GPU each step, streamed up and back over PCIe beside
    # the host's own update (optim/streamed_update.py); device memory: a few chunk-sized buffers
    offload_stream_fraction: Annotated[float, number(0.0, 1.0)] = 0.0
    # ... and their 16-bit gradients kept on the device from backward to that update, not copied down and up
    # again (optim/held_grads.py); nothing to hold unless chunks are streamed
    offload_stream_hold_grads: Bool = True
    # ... and, once its own chunks are queued, the GPU takes the host's remaining chunks from the back until the
    # two sides meet, so neither waits for the other at the end (optim/chunk_claims.py); the device kernel rounds
    # as the host's, so the result is the same bits whoever updates a chunk
    offload_stream_balance: Bool = True



TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}  # the short names' dtypes


class ZeroConfig(Section):
    """The whole config. Build it with `load_config`, which also resolves the batch sizes."""

    train_batch_size: Annotated[int | None, integer(1, optional=True)] = None
    train_micro_batch_size_per_gpu: Annotated[int | None, integer(1, optional=True)] = None
    gradient_accumulation_steps: Annotated[int | None, integer(1, optional=True)] = None
    # DeepSpeed clips at 1.0 unless told otherwise (runtime/constants.py GRADIENT_CLIPPING_DEFAULT, 0.19.8);
    # 0 turns it off
    gradient_clipping: Annotated[float, number(0.0)] = 1.0
    # None: no periodic log (newer DeepSpeed's default; older versions used 10); inf too
    steps_per_print: Annotated[int | None, integer(1, optional=True, infinite_is_none=True)] = None
    wall_clock_breakdown: Bool = False
    communication_data_type: Annotated[str | None, choice(_DTYPE_NAMES, allow_none=True)] = None
    prescale_gradients: Bool = False
    gradient_predivide_factor: Annotated[float, number(0.0, lo_open=True)] = 1.0
    zero_allow_untested_optimizer: Bool = False
    zero_force_ds_cpu_optimizer: Bool = True
    dump_state: Bool = False
    memory_breakdown: Bool = False
    # Not in DeepSpeed's defaults (it needs a client optimizer): zero_core uses AdamW with lr 1e-3.
    optimizer: OptimizerConfig = OptimizerConfig(type="AdamW")
    scheduler: SchedulerConfig | None = None
    fp16: FP16Config = FP16Config()
    bf16: BF16Config = BF16Config()
    zero_optimization: ZeroOptimizationConfig = ZeroOptimizationConfig()
    aio: AioConfig | None = None
    checkpoint: CheckpointConfig = CheckpointConfig()
    zero_core: ZeroCoreConfig = ZeroCoreConfig()
    # logging sections: carried through, not used by the engine
    tensorboard: Opaque = None
    wandb: Opaque = None
    csv_monitor: Opaque = None
    comet: Opaque = None
    flops_profiler: Opaque = None
    comms_logger: Opaque = None
    # DeepSpeed's keys of features zero_core lacks or does its own way (config_keys_deepspeed.py)
    managed_gradient_accumulation: Bool = True
    disable_python_gc: Bool = False
    disable_allgather: Bool = False
    seq_parallel_communication_data_type: Annotated[str | None, choice(_DTYPE_NAMES, allow_none=True)] = "fp32"
    sequence_parallel_size: Annotated[int, integer(1)] = 1
    data_parallel_size: Annotated[int | None, integer(1, optional=True)] = None  # read beside sequence_parallel_size
    gradient_allreduce_op: Annotated[str, choice({"mean": "mean", "sum": "sum"})] = "mean"
    dataloader_drop_last: Bool = False
    log_level: Annotated[str | None, choice({k: k for k in _LOG_LEVELS}, allow_none=True)] = None
    vocabulary_size: Annotated[int | None, integer(1, optional=True)] = None
    use_data_before_expert_parallelism: Bool = False
    torch_autocast: TorchAutocastConfig | None = None
    hybrid_engine: HybridEngineConfig | None = None
    compile: CompileConfig | None = None
    activation_checkpointing: ActivationCheckpointingConfig | None = None
    data_types: DataTypesConfig | None = None
    pipeline: Opaque = None
    timers: Opaque = None
    autotuning: Opaque = None
    data_efficiency: Opaque = None
    expert_parallel: Opaque = None
    tensor_parallel: Opaque = None
    datastates_ckpt: Any = False  # DeepSpeed: anything but false turns DataStates checkpointing on

    @property
    def optimizer_given(self) -> bool:
        """The config has its own "optimizer" section (else AdamW with DeepSpeed's defaults, or a client optimizer)."""
        return "optimizer" in self.model_fields_set

    # The batch sizes as the user gave them (None = absent or "auto"), so that re-validating a resolved
    # config against another world size derives the missing ones again instead of failing.
    _given_batch: tuple[int | None, int | None, int | None] = PrivateAttr(default=(None, None, None))
    _deprecated_form: str | None = PrivateAttr(default=None)  # a note on a deprecated form read

    @model_validator(mode="before")
    @classmethod
    def _bfloat16_alias(cls, data: Any) -> Any:
        # DeepSpeed still reads the legacy top-level "bfloat16" key when "bf16" is absent.
        if isinstance(data, dict) and "bfloat16" in data:
            if "bf16" in data:
                raise full_error(
                    "both 'bf16' and its legacy alias 'bfloat16' are set; keep only 'bf16'", drop="bfloat16"
                )
            data = {("bf16" if k == "bfloat16" else k): v for k, v in data.items()}
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _zero_optimization_bool(cls, data: Any, handler: Any) -> Any:
        # DeepSpeed still reads its first format, "zero_optimization": true (stage 1, buckets of the top-level
        # "allgather_size") or false (stage 0), with a deprecation warning (runtime/zero/config.py, 0.19.8)
        if not (isinstance(data, dict) and isinstance(data.get("zero_optimization"), bool)):
            return handler(data)
        data = dict(data)
        section = {"stage": 1 if data["zero_optimization"] else 0}
        size = data.pop("allgather_size", None)
        if section["stage"] and size is not None:
            section["allgather_bucket_size"] = size
        form = str(data["zero_optimization"]).lower()
        data["zero_optimization"] = section
        cfg = handler(data)
        cfg._deprecated_form = (f'"zero_optimization": {form} is DeepSpeed\'s deprecated form, read as '
                                f'"zero_optimization": {json.dumps(section)}; write it that way')
        return cfg

    @property
    def stage(self) -> int:
        return self.zero_optimization.stage

    @property
    def dtype(self) -> torch.dtype:
        """Working precision of parameters, activations and gradients."""
        if self.fp16.enabled:
            return torch.float16
        return torch.bfloat16 if self.bf16.enabled else torch.float32

    @property
    def comm_dtype(self) -> torch.dtype:
        """Gradient reduction dtype: communication_data_type, else the working precision."""
        return TORCH_DTYPES[self.communication_data_type] if self.communication_data_type else self.dtype

    @property
    def grad_accum_dtype(self) -> torch.dtype:
        """Where gradients add up across micro-steps: data_types.grad_accum_dtype, else the working precision
        (DeepSpeed's default: 16-bit runs accumulate in 16 bits at every stage)."""
        given = self.data_types.grad_accum_dtype if self.data_types is not None else None
        return TORCH_DTYPES[given] if given else self.dtype

    @property
    def dynamic_loss_scale(self) -> bool:
        return self.fp16.enabled and self.fp16.loss_scale == 0

    def describe(self) -> str:
        from .config import describe

        return describe(self)

"""Every DeepSpeed key zero_core knows, and what zero_core does with it: one table for the code, the docs and the tests.

- supported: the engine acts on it (where it applies: stage-3 keys at stage 3, fp16 keys with fp16 on).
- ignored: accepted and not acted on; rank 0 names each one that a config sets, once, in one line.
- refused: a one-line error. `accepts` lists the values that are still accepted because they change
  nothing (DeepSpeed's defaults); set to those, the key is named like an ignored one. A refused whole
  section with a `switch` is accepted while no key of that name in it turns the feature on.

The rows of features zero_core lacks are in config_keys_deepspeed.py. A test fails when a field of the config
models has no row here, and docs/config.md is printed from it.
"""

from __future__ import annotations

from typing import Any

from . import config_keys_deepspeed as ds
from .config_keys_base import IGNORED, REFUSED, SUPPORTED, Key, is_accepted  # noqa: F401 (re-exported)
from .config_keys_base import supported as _supported

_Z = "zero_optimization."
_WARMUP = ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration")
# the parameters each DeepSpeed scheduler takes, in its constructor's order (deepspeed/runtime/lr_schedules.py)
SCHEDULER_ARGUMENTS = {
    "WarmupLR": _WARMUP,
    "WarmupDecayLR": ("total_num_steps", *_WARMUP),
    "WarmupCosineLR": ("total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
                       "last_batch_iteration"),
    "OneCycle": ("cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
                 "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum",
                 "cycle_min_mom", "cycle_max_mom", "decay_mom_rate", "last_batch_iteration"),
    "LRRangeTest": ("lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
                    "lr_range_test_staircase", "last_batch_iteration"),
}
SCHEDULER_KEYS = {kind: frozenset(keys) for kind, keys in SCHEDULER_ARGUMENTS.items()}
_SCHEDULER = tuple(dict.fromkeys(k for keys in SCHEDULER_ARGUMENTS.values() for k in keys))  # every one, once
_LOGGING = "the engine logs nothing of its own"
_SERVICES = "zero_core sends no events to this service (csv_monitor and tensorboard are written)"
LOGGING_SECTIONS = ("tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger")
_NVME_PARAM = "NVMe parameter offload maps the whole partition file; the kernel pages it in and out"
_LIBAIO = "a libaio setting; zero_core's NVMe I/O runs on a thread pool"


def _aio(prefix: str) -> list[Key]:
    return _supported(*(prefix + k for k in ("block_size", "queue_depth", "thread_count"))) + [
        Key(prefix + "intra_op_parallelism", REFUSED, _LIBAIO, (1,)),
        Key(prefix + "single_submit", REFUSED, _LIBAIO, (False,)),
        Key(prefix + "overlap_events", REFUSED, _LIBAIO, (True,)),
        Key(prefix + "use_gds", REFUSED, "GPUDirect Storage is not supported", (False,)),
    ]


KEYS: list[Key] = [
    *_supported(
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "communication_data_type",
    ),
    Key("steps_per_print", IGNORED, "the engine prints no periodic log"),
    Key("wall_clock_breakdown", SUPPORTED,
        "rank 0 prints DeepSpeed's timing lines (fwd, bwd, step per micro-step and per update) with zero_core's times"),
    Key("prescale_gradients", IGNORED, "gradient sums are divided by the world size once, in fp32"),
    Key("gradient_predivide_factor", IGNORED, "gradient sums are divided by the world size once, in fp32"),
    Key("zero_allow_untested_optimizer", SUPPORTED,
        "lets initialize take a torch optimizer zero_core does not know; its update must be element-wise"),
    Key(
        "zero_force_ds_cpu_optimizer", IGNORED, "with optimizer offload the update always runs on zero_core's CPU AdamW"
    ),
    Key("dump_state", IGNORED, "rank 0 always prints the resolved config"),
    Key("memory_breakdown", IGNORED, "no memory report is printed"),
    *ds.TOP,
    Key("optimizer.type", SUPPORTED, "AdamW and Adam run on zero_core's fused kernels with the params below; "
        "Adagrad, Lion (DeepSpeed's rule) and torch.optim's element-wise SGD, RMSprop, Adamax, NAdam, RAdam, "
        "Adadelta, ASGD, Rprop take their own constructor's arguments as params and step on the fp32 shards, "
        "without optimizer offload"),
    *_supported(
        "optimizer.params.lr",
        "optimizer.params.betas",
        "optimizer.params.eps",
        "optimizer.params.weight_decay",
        "optimizer.params.adam_w_mode",
        "optimizer.params.torch_adam",
    ),
    *ds.OPTIMIZER,
    *_supported("scheduler.type", *("scheduler.params." + k for k in _SCHEDULER)),
    *_supported(
        "fp16.enabled",
        "fp16.loss_scale",
        "fp16.initial_scale_power",
        "fp16.loss_scale_window",
        "fp16.hysteresis",
        "fp16.consecutive_hysteresis",
        "fp16.min_loss_scale",
        "bf16.enabled",
    ),
    Key("fp16.auto_cast", IGNORED, "inputs are not cast; pass them in the dtype the model needs"),
    *ds.PRECISION,
    *_supported(
        _Z + "stage",
        _Z + "overlap_comm",
        _Z + "reduce_bucket_size",
        _Z + "stage3_prefetch_bucket_size",
        _Z + "stage3_param_persistence_threshold",
        _Z + "stage3_max_live_parameters",
        _Z + "stage3_max_reuse_distance",
        _Z + "cpu_offload",  # DeepSpeed's deprecated booleans, read as the offload sections (config_zero_models.py)
        _Z + "cpu_offload_param",
    ),
    Key(_Z + "contiguous_gradients", IGNORED, "gradients always land in contiguous buckets"),
    Key(_Z + "reduce_scatter", IGNORED, "stages 1-3 always reduce-scatter the gradient buckets"),
    Key(_Z + "allgather_partitions", IGNORED, "updated weights are always all-gathered from the partitions"),
    Key(_Z + "allgather_bucket_size", IGNORED, "all-gathers use the reduce buckets"),
    Key(_Z + "stage3_gather_16bit_weights_on_model_save", IGNORED, "save_16bit_model always gathers the full weights"),
    Key(_Z + "sub_group_size", IGNORED, "the optimizer steps the whole partition, in chunks of its own with offload"),
    Key(_Z + "round_robin_gradients", IGNORED, "gradient partitions are copied in bucket order"),
    *ds.ZERO,
    *_supported(
        _Z + "offload_optimizer.device",
        _Z + "offload_optimizer.nvme_path",
        _Z + "offload_optimizer.buffer_count",
        _Z + "offload_optimizer.ratio",
    ),
    Key(_Z + "offload_optimizer.pin_memory", IGNORED, "transfer buffers are always pinned on CUDA, the states never"),
    Key(_Z + "offload_optimizer.fast_init", IGNORED, "the NVMe state file is written once at initialize"),
    *ds.OFFLOAD_OPTIMIZER,
    *_supported(_Z + "offload_param.device"),
    Key(_Z + "offload_param.pin_memory", IGNORED, "the host copy of the parameters is always pinned"),
    *_supported(_Z + "offload_param.nvme_path"),
    Key(_Z + "offload_param.buffer_count", IGNORED, _NVME_PARAM),
    Key(_Z + "offload_param.buffer_size", IGNORED, _NVME_PARAM),
    Key(_Z + "offload_param.max_in_cpu", IGNORED, _NVME_PARAM),
    Key(_Z + "aio", REFUSED, "move the 'aio' section to the top level of the config, where DeepSpeed reads it "
        "(DeepSpeed refuses it inside zero_optimization too)"),
    *_aio("aio."),
    Key("checkpoint.tag_validation", IGNORED, "rank 0 names the checkpoint folder for every rank"),
    Key("checkpoint.load_universal", IGNORED, "zbench checkpoints always reshard on load"),
    Key("checkpoint.use_node_local_storage", IGNORED, "checkpoints go to one folder that every rank can see"),
    *ds.CHECKPOINT,
    *_supported(
        "zero_core.comm_timeout_s",
        "zero_core.max_consecutive_nonfinite",
        "zero_core.overlap_weight_gather",
        "zero_core.stage3_gather_from_master",
        "zero_core.async_checkpoint",
        "zero_core.overlap_host_update",
        "zero_core.offload_delayed_update",
        "zero_core.nvme_host_ratio",
        "zero_core.offload_stream_fraction",
        "zero_core.offload_stream_hold_grads",
        "zero_core.offload_stream_balance",
    ),
    Key("csv_monitor", SUPPORTED, "rank 0 writes engine.monitor's events, and the lr (fp16: also the loss scale) "
        "after every update, to `<output_path>/<job_name>/<tag>.csv`, as DeepSpeed lays them out"),
    Key("tensorboard", SUPPORTED, "rank 0 writes the same scalars to `<output_path>/<job_name>` with torch's "
        "SummaryWriter (needs the tensorboard package)"),
    *(Key(section, IGNORED, _SERVICES) for section in ("wandb", "comet")),
    Key("flops_profiler", IGNORED, "turns wall_clock_breakdown on, as DeepSpeed's config does; no profile is printed "
        "and no output_file written"),
    Key("comms_logger", IGNORED, _LOGGING),
    *ds.SECTIONS,
    # DeepSpeed keys that the models lack on purpose: refused whenever present, with the fix
    Key("amp", REFUSED, "use 'fp16' or 'bf16' instead"),
    Key("elasticity", REFUSED, "set the batch sizes explicitly instead"),
    Key(
        "optimizer.params.max_grad_norm",
        REFUSED,
        "use the top-level 'gradient_clipping' key instead (DeepSpeed rejects it too)",
    ),
    *ds.REFUSED_OUTRIGHT,
]

# other names DeepSpeed reads for a zero_optimization key: a legacy spelling, and its config fields' own names
# beside their stage3_ aliases (DeepSpeed's config models populate by either)
ZERO_ALIASES = {
    "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "model_persistence_threshold": "stage3_model_persistence_threshold",
    "module_granularity_threshold": "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params": "stage3_use_all_reduce_for_fetch_params",
    "allgather_sequential": "stage3_allgather_sequential",
}
# the config models rename these to the key in the second column
ALIASES = {"bfloat16": "bf16", **{_Z + old: _Z + new for old, new in ZERO_ALIASES.items()}}

BY_PATH = {k.path: k for k in KEYS}
assert len(BY_PATH) == len(KEYS), "a key is listed twice"


def refused_outright() -> dict[str, str]:
    """Keys refused whatever their value (the models lack them): path -> the fix."""
    return {k.path: k.why for k in KEYS if k.status == REFUSED and not k.accepts}


def refused_unless_accepted() -> list[Key]:
    """Refused keys the models have, accepted at some values (or, for a section with a switch, while it is off)."""
    return [k for k in KEYS if k.status == REFUSED and k.accepts]


def accepted_only_as(prefix: str) -> dict[str, Any]:
    """Refused keys directly under `prefix` that are accepted at one value: name -> that value."""
    return {
        k.path[len(prefix) :]: k.accepts[0]
        for k in KEYS
        if k.status == REFUSED and k.accepts and k.path.startswith(prefix) and "." not in k.path[len(prefix) :]
    }


def not_acted_on(set_paths: list[str]) -> list[Key]:
    """The rows of the keys among `set_paths` that zero_core accepts without acting on them, in the table's order."""
    given = set(set_paths)
    return [k for k in KEYS if k.path in given and k.status != SUPPORTED]

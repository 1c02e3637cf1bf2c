"""DeepSpeedStrategy's keyword arguments for ZeroStrategy: each one becomes the config key it sets in Lightning's
DeepSpeedStrategy (its default config), so zero_core's config validation accepts, ignores with a note or
refuses it exactly as it would in a JSON config. Arguments that are not DeepSpeedStrategy's or ZeroStrategy's
are refused in one line naming them (before, they reached DistributedDataParallel's kwargs and were dropped)."""

from __future__ import annotations

from typing import Any

_Z = "zero_optimization."

# argument -> the dotted config key Lightning writes it to
_CONFIG_KEYS = {
    "stage": _Z + "stage",
    "contiguous_gradients": _Z + "contiguous_gradients",
    "overlap_comm": _Z + "overlap_comm",
    "allgather_partitions": _Z + "allgather_partitions",
    "reduce_scatter": _Z + "reduce_scatter",
    "allgather_bucket_size": _Z + "allgather_bucket_size",
    "reduce_bucket_size": _Z + "reduce_bucket_size",
    "sub_group_size": _Z + "sub_group_size",
    "zero_allow_untested_optimizer": "zero_allow_untested_optimizer",
    "partition_activations": "activation_checkpointing.partition_activations",
    "cpu_checkpointing": "activation_checkpointing.cpu_checkpointing",
    "contiguous_memory_optimization": "activation_checkpointing.contiguous_memory_optimization",
    "synchronize_checkpoint_boundary": "activation_checkpointing.synchronize_checkpoint_boundary",
    "block_size": "aio.block_size",
    "queue_depth": "aio.queue_depth",
    "single_submit": "aio.single_submit",
    "overlap_events": "aio.overlap_events",
    "thread_count": "aio.thread_count",
}
# arguments Lightning writes only inside an offload section (offload_optimizer / offload_param)
_OPTIMIZER_OFFLOAD = {"offload_optimizer_device": "device", "nvme_path": "nvme_path",
                      "optimizer_buffer_count": "buffer_count", "pin_memory": "pin_memory"}
_PARAM_OFFLOAD = {"offload_params_device": "device", "nvme_path": "nvme_path", "params_buffer_count": "buffer_count",
                  "params_buffer_size": "buffer_size", "max_in_cpu": "max_in_cpu", "pin_memory": "pin_memory"}
# fp16 loss-scaling arguments: used for the fp16 section written from Trainer(precision="16-mixed")
FP16_DEFAULTS = {"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
                 "min_loss_scale": 1}
# Strategy arguments DDPStrategy takes itself
STRATEGY_ARGS = ("accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision_plugin",
                 "process_group_backend", "timeout", "start_method")
# accepted with no effect: DeepSpeed's own logger
_NO_EFFECT = ("logging_level",)


def split_deepspeed_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(config entries as a nested dict, fp16 loss-scaling values, DDPStrategy's own arguments) from the keyword
    arguments; raises ValueError for an unknown name or one that has no zero_core counterpart."""
    known = {*_CONFIG_KEYS, *_OPTIMIZER_OFFLOAD, *_PARAM_OFFLOAD, *FP16_DEFAULTS, *STRATEGY_ARGS, *_NO_EFFECT,
             "offload_optimizer", "offload_parameters", "zero_optimization", "logging_batch_size_per_gpu",
             "remote_device", "load_full_weights", "offload_device"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ValueError(
            f"ZeroStrategy got unknown keyword argument(s) {', '.join(unknown)}; use DeepSpeedStrategy's "
            "argument names (stage, offload_optimizer, reduce_bucket_size, ...) or put the setting in config="
        )
    if kwargs.get("remote_device") is not None:
        raise ValueError(
            "remote_device (where DeepSpeed's zero.Init creates parameters) has no zero_core counterpart; drop it "
            "(offload_parameters=True keeps stage-3 parameters in host memory)"
        )
    if kwargs.get("load_full_weights"):
        raise ValueError(
            "load_full_weights=True (resume from a single weights file) is not supported by ZeroStrategy; drop it "
            "and pass ckpt_path= a checkpoint folder, or load the weights into the module before fit"
        )
    entries: dict[str, Any] = {key: kwargs[name] for name, key in _CONFIG_KEYS.items() if name in kwargs}
    if kwargs.get("zero_optimization") is False:
        entries[_Z + "stage"] = 0  # Lightning writes no zero_optimization section: DeepSpeed's stage 0
    batch = kwargs.get("logging_batch_size_per_gpu", "auto")
    if batch != "auto":
        entries["train_micro_batch_size_per_gpu"] = batch
    for switch, section, names in (("offload_optimizer", "offload_optimizer", _OPTIMIZER_OFFLOAD),
                                   ("offload_parameters", "offload_param", _PARAM_OFFLOAD)):
        if kwargs.get(switch):
            entries[f"{_Z}{section}.device"] = kwargs.get("offload_device", "cpu")
            entries.update({f"{_Z}{section}.{key}": kwargs[name] for name, key in names.items() if name in kwargs})
    fp16 = {name: kwargs.get(name, default) for name, default in FP16_DEFAULTS.items()}
    strategy = {name: kwargs[name] for name in STRATEGY_ARGS if name in kwargs}
    return nested(entries), fp16, strategy


def nested(entries: dict[str, Any]) -> dict[str, Any]:
    """{"a.b": 1} -> {"a": {"b": 1}}."""
    tree: dict[str, Any] = {}
    for dotted, value in entries.items():
        *parents, leaf = dotted.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def fill_missing(config: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Put into `config` what `defaults` has and it lacks, section by section (the config wins)."""
    for key, value in defaults.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            fill_missing(config[key], value)
        else:
            config.setdefault(key, value)


def configure_activation_checkpointing(section: dict[str, Any]) -> None:
    """The config's activation_checkpointing section handed to deepspeed.checkpointing.configure, as Lightning's
    DeepSpeed strategy hands it after initialize: a LightningModule calling deepspeed.checkpointing.checkpoint
    then keeps its inputs on the host with cpu_checkpointing."""
    from ..deepspeed.checkpointing import configure

    configure(None, partition_activations=section.get("partition_activations"),
              contiguous_checkpointing=section.get("contiguous_memory_optimization"),
              checkpoint_in_cpu=section.get("cpu_checkpointing"), profile=section.get("profile"))

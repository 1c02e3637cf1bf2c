"""Translate an Accelerate config YAML (`accelerate config` with the DeepSpeed plugin) into a DeepSpeed dict.

Users already have files like this one (from the seed article):

    distributed_type: DEEPSPEED
    mixed_precision: fp16
    deepspeed_config:
      zero_stage: 2
      offload_optimizer_device: none
      offload_param_device: none
      gradient_accumulation_steps: 1
      gradient_clipping: 1.0

The result is what Accelerate's DeepSpeed plugin builds from it: batch sizes "auto", the ZeRO section
from the plugin keys, fp16/bf16 from mixed_precision. With `deepspeed_config_file` the JSON file is the
config and the plugin keys must be absent (Accelerate refuses the mix too). Unknown keys are errors.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from zero_core import ConfigError
from zero_core.config_errors import from_validation_error
from zero_core.config_file import read_config_file

from .limits import MAX_GRAD_ACCUM, MAX_NODES, MAX_RANKS, Flag, count, real
from .yaml_strict import read_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeepSpeedPluginKeys(_Strict):
    zero_stage: Literal[0, 1, 2, 3] | None = None
    offload_optimizer_device: Literal["none", "cpu", "nvme"] | None = None
    offload_param_device: Literal["none", "cpu", "nvme"] | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    gradient_accumulation_steps: count(1, MAX_GRAD_ACCUM) | None = None
    gradient_clipping: real(0) | None = None
    zero3_init_flag: Flag | None = None  # meaningful to transformers' from_pretrained only; carried, unused
    zero3_save_16bit_model: Flag | None = None
    deepspeed_config_file: str | None = None
    deepspeed_hostfile: str | None = None
    deepspeed_multinode_launcher: str | None = None
    deepspeed_exclusion_filter: str | None = None
    deepspeed_inclusion_filter: str | None = None
    deepspeed_moe_layer_cls_names: str | None = None


class AccelerateConfig(_Strict):
    distributed_type: str
    deepspeed_config: DeepSpeedPluginKeys = DeepSpeedPluginKeys()
    mixed_precision: Literal["no", "fp16", "bf16", "fp8"] = "no"
    # launcher settings: zbench's own launcher decides these, so they are accepted and not used
    compute_environment: str | None = None
    debug: bool | None = None
    downcast_bf16: Any = None
    dynamo_config: dict | None = None
    enable_cpu_affinity: bool | None = None
    fsdp_config: dict | None = None
    gpu_ids: Any = None
    machine_rank: count(0, MAX_NODES) | None = None
    main_process_ip: str | None = None
    main_process_port: count(0, 65_535) | None = None
    main_training_function: str | None = None
    megatron_lm_config: dict | None = None
    num_machines: count(1, MAX_NODES) | None = None
    num_processes: count(1, MAX_NODES * MAX_RANKS) | None = None
    rdzv_backend: str | None = None
    same_network: bool | None = None
    use_cpu: bool | None = None
    tpu_env: Any = None
    tpu_name: Any = None
    tpu_zone: Any = None
    tpu_use_cluster: bool | None = None
    tpu_use_sudo: bool | None = None


_PLUGIN_ONLY = (
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero3_save_16bit_model",
)


def _read(path: str) -> AccelerateConfig:
    raw = read_yaml(path, "accelerate_config", ConfigError)  # plain data, no duplicate keys or alias bombs
    try:
        return AccelerateConfig.model_validate(raw if isinstance(raw, dict) else {})
    except ValidationError as err:
        raise ConfigError(f"accelerate_config {path}: {from_validation_error(err, AccelerateConfig)}") from None


def accelerate_num_processes(path: str) -> int | None:
    """The rank count an Accelerate YAML gives `accelerate launch` (all machines together), None when unset."""
    return _read(path).num_processes


def load_accelerate_config(path: str) -> dict[str, Any]:
    """The DeepSpeed dict an Accelerate YAML describes (relative paths inside are relative to the YAML)."""
    acc = _read(path)
    if acc.distributed_type.upper() != "DEEPSPEED":
        raise ConfigError(
            f"accelerate_config {path} has distributed_type {acc.distributed_type!r}; only DEEPSPEED "
            "configs translate to a ZeRO variant"
        )
    return translate(acc, os.path.dirname(os.path.abspath(path)))


def translate(acc: AccelerateConfig, base_dir: str) -> dict[str, Any]:
    """Accelerate's DeepSpeed-plugin rules, without Accelerate."""
    ds = acc.deepspeed_config
    out: dict[str, Any]
    if ds.deepspeed_config_file:
        given = [k for k in _PLUGIN_ONLY if getattr(ds, k) is not None]
        if given:
            raise ConfigError(
                f"accelerate_config: deepspeed_config.{given[0]} cannot be combined with deepspeed_config_file "
                "(Accelerate refuses it too); move it into the JSON file"
            )
        path = ds.deepspeed_config_file
        path = path if os.path.isabs(path) else os.path.join(base_dir, path)
        try:  # the reader every DeepSpeed file goes through: duplicate keys, bad bytes, odd files in one line
            out = read_config_file(path)
        except ConfigError as e:
            raise ConfigError(f"accelerate_config: deepspeed_config_file: {e}") from None
    else:
        zero: dict[str, Any] = {"stage": 2 if ds.zero_stage is None else ds.zero_stage}
        for part in ("optimizer", "param"):
            device = getattr(ds, f"offload_{part}_device") or "none"
            section: dict[str, Any] = {"device": device}
            if device == "nvme":
                section["nvme_path"] = getattr(ds, f"offload_{part}_nvme_path") or "/nvme"
            zero[f"offload_{part}"] = section
        if ds.zero3_save_16bit_model is not None:
            zero["stage3_gather_16bit_weights_on_model_save"] = ds.zero3_save_16bit_model
        out = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": ds.gradient_accumulation_steps or 1,
            "zero_optimization": zero,
        }
        if ds.gradient_clipping is not None:
            out["gradient_clipping"] = ds.gradient_clipping
    if acc.mixed_precision in ("fp16", "bf16"):
        section = out.setdefault(acc.mixed_precision, {})
        if isinstance(section, dict):
            section.setdefault("enabled", True)
    elif acc.mixed_precision == "fp8":
        raise ConfigError("accelerate_config: mixed_precision fp8 is not supported; use fp16 or bf16")
    return out

"""`import zero_core.deepspeed as deepspeed`: the part of DeepSpeed's API that training scripts, Hugging Face
Trainer and Lightning call, on zero_core's engine, so an existing DeepSpeed script runs by changing its import.

    engine, optimizer, dataloader, lr_scheduler = deepspeed.initialize(model=model, model_parameters=groups,
                                                                       config="ds_config.json")
    loss = engine(batch); engine.backward(loss); engine.step()
    engine.save_checkpoint(dir, tag, client_state); path, client_state = engine.load_checkpoint(dir, tag)

`deepspeed.zero.Init()`, `deepspeed.zero.GatheredParameters(...)`, `deepspeed.checkpointing.checkpoint(...)`,
`deepspeed.init_distributed()`, `deepspeed.add_config_arguments(parser)`, `deepspeed.comm`,
`deepspeed.get_accelerator()` (also under `deepspeed.accelerator`), `deepspeed.ops.adam`, `deepspeed.utils`
(zero_to_fp32, log_dist, the timers of `utils.timer`, ...), `deepspeed.runtime.utils`' helpers, `DeepSpeedConfig`,
`deepspeed.profiling.flops_profiler` and the version fields are here too. What DeepSpeed has
and zero_core does not (pipeline and model parallelism, MoE, its own ops) is refused in one line naming the call.
"""

from __future__ import annotations

import argparse
import importlib
import os
from typing import Any

import torch
import torch.distributed as dist

from .. import comm as zero_comm
from ..config_file import config_data
from ..config_auto import is_auto
from ..config_errors import ConfigError
from ..deferred.record import mark_full_sizes
from ..engine import Engine
from . import accelerator, checkpointing, comm, ops, runtime, utils, zero
from .accelerator import get_accelerator
from .runtime.config import DeepSpeedConfig
from .staged_offload import unread_offload_dropped
from .utils import OnDevice

__all__ = ["initialize", "init_distributed", "add_config_arguments", "zero", "checkpointing", "comm", "accelerator",
           "ops", "profiling", "runtime", "utils", "DeepSpeedEngine", "DeepSpeedConfig", "get_accelerator", "OnDevice"]
DeepSpeedEngine = Engine
zero.partition_parameters = runtime.zero.partition_parameters  # as DeepSpeed's deepspeed.zero has it
# the DeepSpeed release whose API this follows (scripts compare against it); the local label says it is zero_core
__version__ = "0.19.8+zero_core"
__version_major__, __version_minor__, __version_patch__ = (int(n) for n in __version__.split("+")[0].split("."))
__git_hash__ = __git_branch__ = "unknown"  # what a pip-installed DeepSpeed reports


_ONLY_DATA_PARALLEL = "zero_core trains data-parallel with ZeRO sharding only"
NOT_PROVIDED = {  # DeepSpeed's names for what is out of zero_core's scope, and what to do instead
    "init_inference": "DeepSpeed's inference engine is not part of zero_core; load the trained weights "
                      "(utils.zero_to_fp32) into the model and run it",
    "pipe": f"pipeline parallelism is not supported; {_ONLY_DATA_PARALLEL}",
    "PipelineModule": f"pipeline parallelism is not supported; {_ONLY_DATA_PARALLEL}",
    "moe": "mixture-of-experts layers are not provided by zero_core; use the model's own",
    "sequence": f"sequence parallelism is not supported; {_ONLY_DATA_PARALLEL}",
}


def __getattr__(name: str) -> Any:
    if name == "profiling":  # imported on first use: torch's flop counter would add to every script's start-up
        return importlib.import_module(f"{__name__}.profiling")
    if name in NOT_PROVIDED:
        raise AttributeError(f"deepspeed.{name} is not provided by zero_core: {NOT_PROVIDED[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _config_from(args: Any, config: Any, config_params: Any) -> Any:
    config = config if config is not None else config_params  # both given: DeepSpeed takes config
    from_args = getattr(args, "deepspeed_config", None) if args is not None else None
    old_name = getattr(args, "deepscale_config", None) if args is not None else None  # DeepSpeed's former flag
    if old_name is not None and from_args is not None:
        raise ValueError("args has both --deepscale_config and --deepspeed_config; pass one (--deepspeed_config)")
    from_args = from_args if from_args is not None else old_name
    if config is not None and from_args is not None:
        raise ValueError("initialize got a config and args.deepspeed_config; pass one")
    config = config if config is not None else from_args
    if config is None:
        raise ValueError("initialize needs a config: config=dict or path, or args with --deepspeed_config")
    return config


def _unread_scheduler_dropped(config: Any, optimizer: Any) -> Any:
    """DeepSpeed builds the config's scheduler only with an optimizer: without one (an evaluation engine, as
    transformers' inference setup makes, whose "auto" total_num_steps became 0) it never reads that section."""
    if optimizer is not None or not isinstance(config, dict) or "optimizer" in config or "scheduler" not in config:
        return config
    return {k: v for k, v in config.items() if k != "scheduler"}


def _refuse_precision_auto(config: Any) -> None:
    """DeepSpeed's config models drop an "auto" value, so `"fp16": {"enabled": "auto"}` that no trainer filled
    trains in fp32 there without a word; here the script is asked which precision it meant."""
    if not isinstance(config, dict):
        return  # the engine's config check names what is wrong with it
    for name in ("fp16", "bf16", "bfloat16"):  # "bfloat16": DeepSpeed's older name of bf16
        section = config.get(name)
        if isinstance(section, dict) and is_auto(section.get("enabled")):
            raise ConfigError(f'{name}.enabled is "auto", which only a trainer fills (DeepSpeed 0.19.8 reads it as '
                              "false and trains in fp32); set it to true or false")


def _round_to_16_bits(model: torch.nn.Module, config: Any) -> None:
    """DeepSpeed casts the module to fp16/bf16 before its optimizer copies the fp32 masters from it, so the masters
    start from the rounded weights: round an fp32 model's weights the same way, in place (they stay fp32 tensors;
    a model built under zero.Init, or on the meta device, is already in its dtype or has no values yet)."""
    from .zero import initial_dtype

    try:
        dtype = initial_dtype(config, None)  # zero.Init's reading of the config (never None here: _config_from)
    except ValueError:
        return  # "auto" or a conflict: the engine's config check names it
    if dtype == torch.float32:
        return
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype == torch.float32 and p.device.type != "meta":
                p.copy_(p.to(dtype))


def initialize(args: Any = None, model: torch.nn.Module | None = None, optimizer: Any = None,
               model_parameters: Any = None, training_data: Any = None, lr_scheduler: Any = None,
               distributed_port: int | None = None, mpu: Any = None, dist_init_required: bool | None = None,
               collate_fn: Any = None, config: Any = None, mesh_param: Any = None, config_params: Any = None
               ) -> tuple[Engine, Any, Any, Any]:
    """(engine, optimizer, training dataloader or None, lr scheduler or None), as deepspeed.initialize returns."""
    if model is None:
        raise ValueError("initialize needs model=; pass the torch.nn.Module to train")
    if mpu is not None or mesh_param is not None:
        raise NotImplementedError("deepspeed.initialize(mpu=/mesh_param=) (model parallelism) is not supported by "
                                  "zero_core; it trains data-parallel with ZeRO sharding only")
    given = _config_from(args, config, config_params)
    data = config_data(given)  # a file read once, for the readings below
    _refuse_precision_auto(data)
    kept = unread_offload_dropped(_unread_scheduler_dropped(data, optimizer))
    config = given if kept is data else kept  # the config as given where nothing was left out
    _round_to_16_bits(model, data)
    engine = Engine(model, config, model_parameters=model_parameters, optimizer=optimizer, lr_scheduler=lr_scheduler)
    if optimizer is None and not engine.config.optimizer_given:  # DeepSpeed: forward only, backward asserts
        engine.training_refused = ("no optimizer: the config has no 'optimizer' section and initialize got no "
                                   "optimizer=, so there is nothing to train with (DeepSpeed refuses backward too); "
                                   "add an 'optimizer' section such as {\"type\": \"AdamW\", \"params\": {\"lr\": "
                                   "1e-4}}, or pass optimizer=")
    if engine.zero_optimization_stage() == 3:  # DeepSpeed's stage 3 converts a model built outside zero.Init
        mark_full_sizes(engine.module.parameters())
        runtime.zero.partition_parameters.mark_zero_params(engine.module.parameters())
    engine.collate_fn = collate_fn  # deepspeed_io's default, as DeepSpeed's engine keeps it
    loader = engine.deepspeed_io(training_data) if training_data is not None else None
    engine.training_dataloader = loader  # as DeepSpeed's engine keeps it
    engine.deepspeed_checkpoints = True  # zero_to_fp32.py beside them, DeepSpeed's client_state from a load
    return engine, engine.client_optimizer, loader, engine.lr_scheduler


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True, distributed_port: int = 29500,
                     verbose: bool = True, timeout: Any = None, init_method: str | None = None,
                     dist_init_required: bool | None = None, config: Any = None, rank: int = -1,
                     world_size: int = -1) -> None:
    """Create the default process group from the launcher's environment (a world of one without a launcher)."""
    if dist.is_initialized():
        return
    if "WORLD_SIZE" not in os.environ and world_size in (-1, 1):
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(distributed_port))
    device = zero_comm.pick_device()
    backend = dist_backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":  # a GPU script's hard-coded backend, run on CPUs
        if os.environ.get("RANK", "0") == "0":
            print("zero_core: init_distributed(dist_backend='nccl') without a CUDA device uses gloo", flush=True)
        backend = "gloo"
    kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
    if rank >= 0 and world_size > 0:
        kwargs.update(rank=rank, world_size=world_size)
    dist.init_process_group(backend, init_method=init_method, **kwargs)


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """DeepSpeed's command-line arguments: --deepspeed and --deepspeed_config (and their former names --deepscale,
    --deepscale_config, which older scripts pass)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true", help="Enable DeepSpeed (zero_core)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true", help="Former name of --deepspeed")
    group.add_argument("--deepscale_config", default=None, type=str, help="Former name of --deepspeed_config")
    return parser

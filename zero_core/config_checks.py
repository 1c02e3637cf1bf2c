"""Contradictions between fields of a validated config: every one found, each a `Problem` naming its keys and the
fix."""

from __future__ import annotations

import json
from collections.abc import Iterator

from .config_checks_monitor import monitor_problems
from .config_checks_refused import refused_values
from .config_errors import Problem
from .config_keys import accepted_only_as
from .config_models import SCHEDULER_KEYS, AioConfig, ZeroConfig

_Z = "zero_optimization."


def contradictions(cfg: ZeroConfig) -> list[Problem]:
    checks = (_precision_and_optimizer, _scheduler, _offload, _grad_norm, _overlap, _streamed, _delayed_update,
              _aio, refused_values, monitor_problems)
    return [problem for check in checks for problem in check(cfg)]


def _precision_and_optimizer(cfg: ZeroConfig) -> Iterator[Problem]:
    if cfg.fp16.enabled and cfg.bf16.enabled:
        yield Problem(
            ("fp16.enabled", "bf16.enabled"), "fp16.enabled and bf16.enabled are both true; enable only one of them"
        )
    opt = cfg.optimizer
    if opt.type == "AdamW" and "adam_w_mode" in opt.params.model_fields_set and not opt.params.adam_w_mode:
        yield Problem(
            ("optimizer.type", "optimizer.params.adam_w_mode"),
            "optimizer.params.adam_w_mode=false has no effect with optimizer.type 'AdamW' (DeepSpeed ignores "
            "it too); use type 'Adam' for L2-style weight decay or remove it",
        )


def _scheduler(cfg: ZeroConfig) -> Iterator[Problem]:
    if cfg.scheduler is None:
        return
    kind, p = cfg.scheduler.type, cfg.scheduler.params
    for stray in sorted(p.model_fields_set - SCHEDULER_KEYS[kind]):
        users = [k for k, keys in SCHEDULER_KEYS.items() if stray in keys]
        yield Problem(
            ("scheduler.type", f"scheduler.params.{stray}"),
            f"scheduler.params.{stray} does not apply to {kind} (it is a parameter of {' and '.join(users)}); "
            "remove it or change scheduler.type",
        )
    if kind in ("WarmupDecayLR", "WarmupCosineLR") and p.total_num_steps is None:
        yield Problem(
            ("scheduler.type", "scheduler.params.total_num_steps"),
            f"scheduler.params.total_num_steps is required for {kind}; set it to the number of optimizer steps "
            "of the run",
        )
    if kind == "OneCycle" and (p.cycle_min_lr is None or p.cycle_max_lr is None):
        yield Problem(
            ("scheduler.type", "scheduler.params.cycle_min_lr", "scheduler.params.cycle_max_lr"),
            "scheduler.params.cycle_min_lr and cycle_max_lr are required for OneCycle; set both",
        )


def _offload(cfg: ZeroConfig) -> Iterator[Problem]:
    zero = cfg.zero_optimization
    param, off = zero.offload_param, zero.offload_optimizer
    if param is not None and param.device != "none" and zero.stage < 3:
        yield Problem(
            (_Z + "stage", _Z + "offload_param.device"),
            f"zero_optimization.offload_param needs stage 3 but zero_optimization.stage is {zero.stage}; "
            "remove offload_param or set the stage to 3",
        )
    if param is not None and param.device == "nvme" and not param.nvme_path:
        yield Problem(
            (_Z + "offload_param.nvme_path",),
            "zero_optimization.offload_param.nvme_path is required with device 'nvme'; set it to a "
            "directory on a fast local disk",
        )
    host_ratio = cfg.zero_core.nvme_host_ratio
    if host_ratio > 0 and (off is None or off.device != "nvme"):
        yield Problem(
            ("zero_core.nvme_host_ratio", _Z + "offload_optimizer.device"),
            f"zero_core.nvme_host_ratio={host_ratio:g} splits NVMe optimizer offload between host memory and "
            f"disk, but offload_optimizer.device is '{off.device if off else 'none'}'; set the device to 'nvme' "
            "(with nvme_path) or drop the key",
        )
    if off is None or off.device == "none":
        return
    if zero.stage == 0:
        yield Problem(
            (_Z + "stage", _Z + "offload_optimizer.device"),
            "zero_optimization.offload_optimizer needs stage 1, 2 or 3 but zero_optimization.stage is 0; "
            "set the stage to 1-3 or the offload device to 'none'",
        )
    if off.ratio == "auto" and off.device == "nvme":
        yield Problem(
            (_Z + "offload_optimizer.ratio", _Z + "offload_optimizer.device"),
            "zero_optimization.offload_optimizer.ratio='auto' moves states from host memory to the GPU after "
            "the first step, which NVMe offload does not support; set a number (0 < ratio <= 1) or device 'cpu'",
        )
    if off.device == "nvme" and not off.nvme_path:
        yield Problem(
            (_Z + "offload_optimizer.nvme_path",),
            "zero_optimization.offload_optimizer.nvme_path is required with device 'nvme'; set it to a "
            "directory on a fast local disk",
        )
    if off.device == "nvme" and off.buffer_count < 2:
        yield Problem(
            (_Z + "offload_optimizer.buffer_count",),
            f"zero_optimization.offload_optimizer.buffer_count={off.buffer_count} is too small for NVMe "
            "offload: one chunk is updated while the next is read; set 2 or more (4 is the default)",
        )


def _grad_norm(cfg: ZeroConfig) -> Iterator[Problem]:
    """DeepSpeed's zero_optimization model refuses compute_grad_norm=false outside stages 1-2; zero_core, which
    always computes the norm, refuses the same configs so that they fail here as they would there."""
    zero = cfg.zero_optimization
    if not zero.compute_grad_norm and zero.stage not in (1, 2):
        yield Problem(
            (_Z + "stage", _Z + "compute_grad_norm"),
            f"zero_optimization.compute_grad_norm=false is allowed only at stages 1 and 2 (DeepSpeed refuses it "
            f"too), but zero_optimization.stage is {zero.stage}; remove it or set true",
        )


def _overlap(cfg: ZeroConfig) -> Iterator[Problem]:
    """The host update during backward works on states in host memory; elsewhere it would silently do nothing."""
    fraction, off = cfg.zero_core.overlap_host_update, cfg.zero_optimization.offload_optimizer
    device = off.device if off is not None else "none"
    if fraction > 0 and device != "cpu":
        yield Problem(
            ("zero_core.overlap_host_update", _Z + "offload_optimizer.device"),
            f"zero_core.overlap_host_update={fraction:g} updates optimizer states in host memory during backward, "
            f"but offload_optimizer.device is '{device}' (no states there to update); set the device to 'cpu' or "
            "drop the key",
        )


def _streamed(cfg: ZeroConfig) -> Iterator[Problem]:
    """The streamed update reads and writes states held in host memory, in place."""
    fraction, off = cfg.zero_core.offload_stream_fraction, cfg.zero_optimization.offload_optimizer
    device = off.device if off is not None else "none"
    key = "zero_core.offload_stream_fraction"
    if fraction > 0 and device != "cpu":
        yield Problem(
            (key, _Z + "offload_optimizer.device"),
            f"{key}={fraction:g} streams optimizer states held in host memory to the GPU, but "
            f"offload_optimizer.device is '{device}'; set the device to 'cpu' or drop the key",
        )
    if fraction > 0 and cfg.zero_core.offload_delayed_update:
        yield Problem(
            (key, "zero_core.offload_delayed_update"),
            f"{key}={fraction:g} and zero_core.offload_delayed_update=true both change where the host update "
            "runs; keep one",
        )


def _delayed_update(cfg: ZeroConfig) -> Iterator[Problem]:
    core, off = cfg.zero_core, cfg.zero_optimization.offload_optimizer
    if not core.offload_delayed_update:
        return
    key = "zero_core.offload_delayed_update"
    if off is None or off.device == "none":
        yield Problem(
            (key,),
            f"{key}=true delays the host update of optimizer offload, but offload_optimizer is off; "
            "set zero_optimization.offload_optimizer.device to 'cpu' or drop the key",
        )
    elif off.ratio != 1.0:
        yield Problem(
            (key, _Z + "offload_optimizer.ratio"),
            f"{key}=true delays the whole host update and cannot be combined with partial offload "
            f"(offload_optimizer.ratio={off.ratio}); drop one of them",
        )
    if core.overlap_host_update > 0:
        yield Problem(
            (key, "zero_core.overlap_host_update"),
            f"{key}=true and zero_core.overlap_host_update={core.overlap_host_update:g} both move the host "
            "update; keep one (the delayed update changes numerics, the overlap does not)",
        )


def _aio(cfg: ZeroConfig) -> Iterator[Problem]:
    """The top-level aio section (DeepSpeed refuses one inside zero_optimization: a refused key of config_keys.py)."""
    if cfg.aio is not None:
        yield from _one_aio("aio", cfg.aio)


def _one_aio(where: str, aio: AioConfig) -> Iterator[Problem]:
    if aio.block_size % 4096 or aio.block_size == 0:
        yield Problem(
            (f"{where}.block_size",),
            f"{where}.block_size={aio.block_size} must be a positive multiple of 4096 (NVMe requests are "
            "4 KiB-aligned); 1048576 is DeepSpeed's default",
        )
    if aio.use_gds:
        yield Problem(
            (f"{where}.use_gds",),
            f"{where}.use_gds=true (GPUDirect Storage) is not supported; remove it or set false",
            lacking=True,
        )
    for key, default in accepted_only_as("aio.").items():
        if key != "use_gds" and getattr(aio, key) != default:
            yield Problem(
                (f"{where}.{key}",),
                f"{where}.{key}={json.dumps(getattr(aio, key))} is a libaio setting zero_core does not use "
                f"(its NVMe I/O runs on a thread pool); remove it or set {json.dumps(default)}",
            )

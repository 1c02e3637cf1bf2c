"""Where a rank's optimizer states live, and the update that goes with them: the offload strategy.

    device (default)        DeviceAdamW: fp32 master and moments on the GPU, fused Triton kernels
    offload_optimizer cpu   HostAdamW over states in host memory: torch's fused CPU Adam in chunks
    offload_optimizer nvme  HostAdamW over states in one file per rank on NVMe, streamed chunk by chunk
    ... nvme_host_ratio H   HostAdamW over SplitStates: the first H of the offloaded share in host memory
    ... with ratio < 1      SplitAdamW: the first buckets on the device (DeviceAdamW), the rest offloaded
    zero_core.offload_stream_fraction   some of the host share's chunks updated on the GPU, states streamed
    a torch optimizer (passed to initialize, or the config's SGD, Adagrad, Lion, ...)   ClientOptimizer: it steps
                            as it is on the fp32 master on the device (no optimizer offload)

Every one honours the same interface (base.py), which the gradient reducer and the engine call.
"""

from __future__ import annotations

import torch

from ..config_models import AioConfig, ZeroConfig
from ..lr_schedules import make_lr_schedule
from ..host_pages import release_pages
from ..step_timer import StepBreakdown
from ..config_errors import ConfigError
from ..config_optimizer_types import build
from .base import Hyper, PartitionOptimizer
from .client_optimizer import ClientOptimizer
from .delayed_update import DelayedHostAdamW
from .device_adam import DeviceAdamW
from .host_adam import HostAdamW
from .param_groups import OptimizerPlan, segment_runs
from .auto_ratio import AutoOffload, probe_for
from .split_adam import SplitAdamW, device_segment_count, empty_share_note
from .split_states import SplitStates
from .states import NAMES, TensorStates, make_states

__all__ = [
    "PartitionOptimizer",
    "DeviceAdamW",
    "HostAdamW",
    "SplitAdamW",
    "Hyper",
    "make_optimizer",
    "offloads_optimizer",
]


def offloads_optimizer(cfg: ZeroConfig) -> bool:
    off = cfg.zero_optimization.offload_optimizer
    return off is not None and off.device in ("cpu", "nvme")


def make_optimizer(
    cfg: ZeroConfig,
    layout,
    device: torch.device,
    rank: int,
    breakdown: StepBreakdown,
    plan: OptimizerPlan,
    slot_groups: list[int],
) -> PartitionOptimizer:
    """The optimizer for this rank's partition of `layout`, its states placed as the config says, with the
    hyper-parameters of each group of `plan` (`slot_groups[i]`: the group of layout slot i)."""
    zero = cfg.zero_optimization
    named = plan.kind == "fused" and cfg.optimizer.arguments is not None  # the config's SGD, Adagrad, Lion, ...
    if named and offloads_optimizer(cfg):
        raise ConfigError(
            f"optimizer.type '{cfg.optimizer.type}' runs on the device shards, and optimizer offload updates on the "
            "host with AdamW/Adam only; set optimizer.type to AdamW or Adam, or remove "
            "zero_optimization.offload_optimizer"
        )
    if named:
        use_config_optimizer(cfg, plan)
    client = plan.kind == "client"
    if client and offloads_optimizer(cfg):
        raise ConfigError(
            f"a {type(plan.client).__name__} optimizer runs on the device shards; optimizer offload "
            "updates on the host with AdamW/Adam only: pass torch.optim.AdamW/Adam or drop offload_optimizer"
        )
    groups = [Hyper(g.betas[0], g.betas[1], g.eps, g.weight_decay) for g in plan.groups]
    runs = segment_runs(layout, rank, slot_groups)
    kw = dict(
        groups=groups,
        runs=runs,
        decoupled=plan.decoupled,
        clip=float(cfg.gradient_clipping or 0.0),
        lr_at=make_lr_schedule(cfg, [g.lr for g in plan.groups]),
        shard_stats=cfg.stage > 0,
        stage=cfg.stage,
        comm_device=device,
    )
    aio = cfg.aio or AioConfig()
    ratio = offload_ratio(cfg)
    on_device = device_segment_count(runs, ratio) if offloads_optimizer(cfg) else 0
    if offloads_optimizer(cfg) and not on_device and ratio < 1.0 and len(runs) > 1 and rank == 0:
        print(empty_share_note(runs, ratio), flush=True)
    if on_device or (offloads_optimizer(cfg) and zero.offload_optimizer.ratio == "auto"):
        return _split(layout.partition_numel, runs, on_device, cfg, device, rank, aio, breakdown, kw)
    if client:  # never offloaded (refused above): the fp32 master on the device, the client keeps its own state
        states = make_states(layout.partition_numel, device, None, aio, rank, names=("master",))
        return ClientOptimizer(states, plan.client, **kw)
    states = offloaded_states(layout.partition_numel, cfg, device, aio, rank)
    if offloads_optimizer(cfg):
        if cfg.zero_core.offload_delayed_update:
            return DelayedHostAdamW(states, comm_dtype=cfg.comm_dtype, breakdown=breakdown, **kw)
        return HostAdamW(states, comm_dtype=cfg.comm_dtype, breakdown=breakdown, **_host_overlap(cfg), **kw)
    return DeviceAdamW(states, **kw)


def use_config_optimizer(cfg: ZeroConfig, plan: OptimizerPlan) -> None:
    """The torch optimizer the config names (config_optimizer_types.py), built over the plan's groups with the
    config's arguments (a group's own keys first, as torch takes them), recorded in `plan` as one passed to
    initialize would be: it steps as a client optimizer and the engine hands it back."""
    groups = [{**{k: v for k, v in g.options.items() if k != "params"}, "params": g.params} for g in plan.groups]
    plan.client = build(cfg.optimizer.type, cfg.optimizer.arguments or {}, groups)
    plan.kind = "client"


def _host_overlap(cfg: ZeroConfig) -> dict[str, float | bool]:
    """How the host share's update overlaps: started during backward, and some of its chunks streamed to the GPU
    (their gradients perhaps held there, the rest shared out as each side is free)."""
    return dict(overlap_fraction=cfg.zero_core.overlap_host_update,
                stream_fraction=cfg.zero_core.offload_stream_fraction,
                hold_grads=cfg.zero_core.offload_stream_hold_grads, balance=cfg.zero_core.offload_stream_balance)


def offload_ratio(cfg: ZeroConfig) -> float:
    """The offloaded fraction of each rank's optimizer partition (1.0: all of it; "auto" starts there)."""
    off = cfg.zero_optimization.offload_optimizer
    return 1.0 if off is None or off.ratio == "auto" else float(off.ratio)


def offloaded_states(numel: int, cfg: ZeroConfig, device: torch.device, aio, rank: int):
    """The store for `numel` offloaded elements (or device ones without offload). With NVMe and
    `zero_core.nvme_host_ratio` H, the first H of them in host memory and the rest on NVMe, so that host
    memory and disk together hold the states: HostAdamW streams both as one store."""
    off, host_ratio = cfg.zero_optimization.offload_optimizer, cfg.zero_core.nvme_host_ratio
    in_host = int(host_ratio * numel) if off is not None and off.device == "nvme" else 0
    if not in_host:
        return make_states(numel, device, off, aio, rank)
    return SplitStates(TensorStates(in_host, torch.device("cpu")), make_states(numel - in_host, device, off, aio, rank))


def _split(
    numel: int,
    runs,
    on_device: int,
    cfg: ZeroConfig,
    device: torch.device,
    rank: int,
    aio,
    breakdown: StepBreakdown,
    kw: dict,
) -> SplitAdamW:
    """Partial offload: the first `on_device` segments' states on the device, the rest where the config says;
    with ratio "auto" none at first, and after the first step as many as fit (auto_ratio.py)."""
    split = runs[on_device][0][0] if on_device else 0
    states = SplitStates(
        TensorStates(split, device),
        offloaded_states(numel - split, cfg, device, aio, rank),
    )
    opt = _assemble(states, runs, on_device, cfg, breakdown, kw)
    if cfg.zero_optimization.offload_optimizer.ratio == "auto":
        opt.auto = AutoOffload(runs, probe_for(device), lambda count: _moved(opt, count, runs, cfg, breakdown, kw))
    return opt


def _assemble(
    states: SplitStates, runs, on_device: int, cfg: ZeroConfig, breakdown: StepBreakdown, kw: dict,
    staging: torch.Tensor | None = None,
) -> SplitAdamW:
    split = states.split
    host_runs = [[(lo - split, hi - split, g) for lo, hi, g in seg] for seg in runs[on_device:]]
    device_opt = DeviceAdamW(states.device_part, **{**kw, "runs": runs[:on_device]})
    host_opt = HostAdamW(
        states.host_part,
        comm_dtype=cfg.comm_dtype,
        breakdown=breakdown,
        staging=staging,
        **_host_overlap(cfg),
        **{**kw, "runs": host_runs},
    )
    return SplitAdamW(states, device_opt, host_opt, **kw)


def _moved(old: SplitAdamW, on_device: int, runs, cfg: ZeroConfig, breakdown: StepBreakdown, kw: dict) -> SplitAdamW:
    """`old` (everything offloaded, in host memory) with its first `on_device` segments' states moved to the device.

    The host gets back what the moved states held, before the new optimizer takes anything: the moved front
    of each state buffer is released to the kernel, the old speculative copies and fp32 gradients are freed,
    and the new host share lands its gradients in the old pinned staging's tail. (A run whose host memory the
    first step filled is otherwise killed here, allocating beside what it no longer needs.)"""
    split, host = runs[on_device][0][0], old.states.host_part
    assert old.split == 0, "only a fully offloaded optimizer is re-split"
    device_part = TensorStates(split, old.states.device)
    for name in NAMES:
        getattr(device_part, name).copy_(getattr(host, name)[:split])
        release_pages(getattr(host, name)[:split])
    old_host = old.host_opt
    if old_host.streamed is not None:
        old_host.streamed.close()  # unpinned before its pages go back
    old_host.speculative.release()
    old_host.grad = None
    staging = old_host.staging[split:]
    new = _assemble(SplitStates(device_part, host.part(split, host.numel)), runs, on_device, cfg, breakdown, kw,
                    staging=staging)
    new.take_over(old)
    return new

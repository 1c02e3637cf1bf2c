"""The Engine: one object that trains any nn.Module at ZeRO stage 0, 1, 2 or 3.

The stages differ only in what each rank keeps and which collective moves gradients and weights;
the pieces (flat layout, gradient reducer, sharded optimizer, stage-3 gatherer) are shared.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from . import affinity, comm
from .config import ZeroConfig, describe, load_config
from .config_models import AioConfig
from .grad_reducer import GradReducer
from .host_adam import HostAdamW, WeightUploader
from checkpoints.layout import FlatLayout, build_layout
from .loss_scaler import LossScaler
from .lr_schedules import make_lr_schedule
from .overflow_log import OverflowLog
from .param_gather import ParamGatherer
from .opt_states import make_states
from .sharded_optimizer import ShardedAdamW
from .step_timer import StepBreakdown, enabled_for
from .weight_gather import DeferredWeightGather



def _stage3_units(model: torch.nn.Module, trainable: set[int]) -> tuple[list[torch.nn.Parameter], list[int], list]:
    """Order parameters by unit. Each child of an nn.ModuleList (a transformer block) is one unit with its
    whole subtree, and every parameter outside the blocks (embeddings, final norm, a tied head, relative
    position tables read by a parent) forms one root unit, gathered for the whole forward and backward,
    as FSDP2 wraps the root. A model without blocks gets one unit per module that owns parameters.

    Block-sized units keep all-gathers and reduce-scatters large; the root unit covers parameters that
    a module reads without calling the module that holds them. A unit that reuses a parameter owned by
    another (tied embeddings) needs that unit gathered too.
    """
    owner: dict[int, int] = {}
    ordered: list[torch.nn.Parameter] = []
    bounds: list[int] = []
    units: list[tuple[torch.nn.Module, tuple[int, ...]]] = []

    def add_unit(module: torch.nn.Module, params: list[torch.nn.Parameter]) -> None:
        params = [p for p in dict.fromkeys(params) if id(p) in trainable]
        own = [p for p in params if id(p) not in owner]
        if own:
            bounds.append(len(ordered))
            for p in own:
                owner[id(p)] = len(bounds) - 1
                ordered.append(p)
        needed = tuple(dict.fromkeys(owner[id(p)] for p in params))
        if needed:
            units.append((module, needed))

    blocks: list[torch.nn.Module] = []
    outside: list[torch.nn.Module] = []

    def split(module: torch.nn.Module, is_block: bool) -> None:
        if is_block:
            blocks.append(module)
            return
        outside.append(module)
        for child in module.children():
            split(child, isinstance(module, torch.nn.ModuleList))

    split(model, False)
    direct = [[p for p in m._parameters.values() if p is not None] for m in outside]
    if blocks:
        add_unit(model, [p for ps in direct for p in ps])
        for block in blocks:
            add_unit(block, list(block.parameters()))
    else:
        for module, ps in zip(outside, direct):
            add_unit(module, ps)
    return ordered, bounds, units


def _bucket_units(units: list, unit_params: list[torch.nn.Parameter], bounds: list[int], params: list[torch.nn.Parameter],
                  layout: FlatLayout) -> list[tuple[torch.nn.Module, list[int]]]:
    """Stage-3 units (module, unit indices it reads; the root unit first) re-expressed as the stage 1-2
    buckets they read. `unit_params` is in unit order, `params` in layout order."""
    index = {id(p): i for i, p in enumerate(params)}
    ends = bounds[1:] + [len(unit_params)]
    buckets_of_unit = [sorted({layout.slots[index[id(p)]].group for p in unit_params[lo:hi]}) for lo, hi in zip(bounds, ends)]
    return [(module, sorted({b for u in needed for b in buckets_of_unit[u]})) for module, needed in units]


class Engine:
    """Wraps a model for ZeRO data-parallel training; build it with `zero_core.initialize`."""

    def __init__(self, model: torch.nn.Module, config: dict | str | ZeroConfig) -> None:
        self.device = comm.pick_device()
        comm.ensure_process_group(self.device)
        self.world_size, self.rank = comm.world_size(), comm.rank()
        self.config: ZeroConfig = load_config(config, self.world_size)
        cfg = self.config
        if cfg.zero_core.comm_timeout_s is not None:
            comm.set_timeout(cfg.zero_core.comm_timeout_s)
        if self.rank == 0:
            print(f"zero_core: resolved config (world size {self.world_size}):\n{describe(cfg)}", flush=True)
        self.stage = cfg.stage
        self.dtype = cfg.dtype
        self.gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self.global_step = 0
        self.micro_steps = 0
        self.module = model.to(self.device)
        zero = cfg.zero_optimization

        named = {id(p): n for n, p in model.named_parameters()}
        trainable_params = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad]
        if not trainable_params:
            raise ValueError("the model has no trainable parameters; unfreeze some (requires_grad=True) before initialize")
        units: list = []
        if self.stage == 3:
            params, bounds, units = _stage3_units(model, {id(p) for p in trainable_params})
            layout = build_layout([(named[id(p)], p.shape) for p in params], self.world_size, group_bounds=bounds)
        else:
            params = trainable_params
            if self.stage in (1, 2):  # the modules' forwards wait for their buckets' gathers (weight_gather.py)
                unit_params, bounds, units = _stage3_units(model, {id(p) for p in trainable_params})
            layout_world = 1 if self.stage == 0 else self.world_size  # stage 0: every rank holds everything
            layout = build_layout([(named[id(p)], p.shape) for p in params], layout_world, bucket_numel=zero.reduce_bucket_size)
        self.layout: FlatLayout = layout
        self.params = params
        self._cast_frozen_and_buffers(model, {id(p) for p in params})

        # offload: fp32 master and moments in host memory or on NVMe, updated on the host (host_adam.py);
        # at stage 3 optionally the 16-bit shards in host memory too
        off_opt, off_param = zero.offload_optimizer, zero.offload_param
        self.offload_optimizer = off_opt is not None and off_opt.device in ("cpu", "nvme")
        self.offload_param = off_param is not None and off_param.device == "cpu"
        self.pinned_cpus = affinity.pin_rank(self.offload_optimizer)  # this rank's own cores (None: not pinned)
        if self.pinned_cpus and self.rank == 0:
            print(f"zero_core: local rank 0 pinned to cpus {affinity.describe(self.pinned_cpus)}, "
                  f"{torch.get_num_threads()} threads ({affinity.ENV}=0 turns this off)", flush=True)
        self.breakdown = StepBreakdown(self.device, enabled_for(self.offload_optimizer))  # step-time breakdown
        state_device = torch.device("cpu") if self.offload_optimizer else self.device
        states = make_states(layout.partition_numel, self.device, off_opt, cfg.aio or zero.aio or AioConfig(), self.rank)
        full = self._flatten(params, layout, states.writer())
        self.scaler = LossScaler(cfg, state_device)
        opt = cfg.optimizer
        opt_kw = dict(betas=tuple(opt.params.betas), eps=opt.params.eps, weight_decay=opt.params.weight_decay,
                      decoupled=opt.decoupled, clip=float(cfg.gradient_clipping or 0.0), lr_at=make_lr_schedule(cfg),
                      shard_stats=self.stage > 0, comm_device=self.device)
        segments = [(g.partition_offset, g.shard_numel) for g in layout.groups]
        self.optimizer = (HostAdamW(states, comm_dtype=cfg.comm_dtype, breakdown=self.breakdown, **opt_kw)
                          if self.offload_optimizer else ShardedAdamW(states, segments=segments, **opt_kw))
        self._full = full
        self.side = comm.SideStream(self.device, enabled=zero.overlap_comm or self.stage == 3)
        self.gatherer: ParamGatherer | None = None
        self._local: torch.Tensor | None
        if self.stage == 0:
            self._local = self._flat_working  # the whole flat buffer is this rank's partition
        elif self.stage in (1, 2):
            # the update (or, with offload, the upload of the host's output) writes each bucket's shard straight
            # into the full buffer and the all-gather fills the rest in place: no separate 16-bit partition on
            # the device (GPT-2 XL on 2 ranks: 1.56 GB less per GPU)
            self._local = None
        elif self.stage == 3 and not self.offload_optimizer and not self.offload_param and cfg.zero_core.stage3_gather_from_master:
            self._local = None  # gathers cast the fp32 master shard: no 16-bit partition (GPT-2 XL, 2 ranks: 1.45 GiB)
        else:
            local_on_host = self.offload_param
            self._local = (comm.host_buffer(layout.partition_numel, self.dtype, pin=True) if local_on_host
                           else torch.empty(layout.partition_numel, dtype=self.dtype, device=self.device))
            for g in layout.groups:
                lo, hi = layout.shard_range(g.index, self.rank)
                self._local[g.partition_offset : g.partition_offset + g.shard_numel].copy_(full[g.index][lo:hi])
        # the optimizer writes its working-precision output where it runs; publishing copies it across if needed
        self._opt_out: torch.Tensor | list[torch.Tensor] | None
        if self._local is None and self.stage == 3:
            self._opt_out = None  # the update keeps only the fp32 master
        elif self._local is None and not self.offload_optimizer:
            self._opt_out = [self._shard_view(g) for g in layout.groups]  # one view per optimizer segment
        elif self._local is None:  # the host step's 16-bit output, uploaded into the shards (below)
            self._opt_out = comm.host_buffer(layout.partition_numel, self.dtype, pin=self.device.type == "cuda")
            for g in layout.groups:
                self._opt_out[g.partition_offset : g.partition_offset + g.shard_numel].copy_(self._shard_view(g))
        elif self._local.device == state_device:
            self._opt_out = self._local
        elif state_device.type == "cpu":
            self._opt_out = comm.host_buffer(layout.partition_numel, self.dtype, pin=True)
        else:
            self._opt_out = torch.empty(layout.partition_numel, dtype=self.dtype, device=state_device)
        if self._local is not None and self._opt_out is not self._local:
            self._opt_out.copy_(self._local)
        # offload on CUDA: the host step sends each finished chunk up at once; stages 1-2 all-gather each
        # bucket as soon as its chunks are up
        self._uploader: WeightUploader | None = None
        if self._local is None and self.offload_optimizer:  # stages 1-2 (on the CPU too: the same path)
            ends = [g.partition_offset + g.shard_numel for g in layout.groups]
            self._uploader = WeightUploader(self._opt_out, [(g.partition_offset, self._shard_view(g)) for g in layout.groups],
                                            self.breakdown, ends, gather=lambda i: self._all_gather_group(self.layout.groups[i]))
        elif self._local is not None and self._opt_out.device.type == "cpu" and self._local.is_cuda:  # stage 3
            self._uploader = WeightUploader(self._opt_out, [(0, self._local)], self.breakdown)
        if self.stage == 3:
            self.gatherer = ParamGatherer(
                units, layout, full, self._stage3_shard_source(),
                persistence_threshold=zero.stage3_param_persistence_threshold,
                prefetch_numel=zero.stage3_prefetch_bucket_size, max_live_numel=zero.stage3_max_live_parameters,
                side=comm.SideStream(self.device),  # its own stream: prefetches must not queue behind reductions
            )
        self._deferred: DeferredWeightGather | None = None
        if (self.stage in (1, 2) and not self.offload_optimizer and cfg.zero_core.overlap_weight_gather
                and self.world_size > 1):  # (with offload the uploads start each bucket's gather)
            bucket_units = _bucket_units(units, unit_params, bounds, params, layout)
            self._deferred = DeferredWeightGather(bucket_units, self._start_gather, model)
            # update (and so gather) first the buckets the model reads before its first block, then the rest
            # in forward order: the first forward waits only for those
            first = sorted(bucket_units[0][1]) if bucket_units else []
            self.optimizer.segment_order = first + [i for i in range(len(layout.groups)) if i not in first]
        self.reducer = GradReducer(
            params, layout, self.optimizer, stage=self.stage, comm_dtype=cfg.comm_dtype, side=self.side, device=self.device,
            on_group_reduced=self.gatherer.on_group_reduced if self.gatherer else None, breakdown=self.breakdown,
        )
        # consecutive optimizer steps with non-finite gradients, on the device (the hot loop never reads it)
        self._nonfinite_run = torch.zeros(1, dtype=torch.float32, device=state_device)
        self.overflow_log = OverflowLog(self.optimizer.skipped, self.scaler, self._nonfinite_run,
                                        cfg.zero_core.max_consecutive_nonfinite)

    # -- set-up -----------------------------------------------------------------------------------
    def _cast_frozen_and_buffers(self, model: torch.nn.Module, trainable: set[int]) -> None:
        """Frozen parameters and floating buffers run in the working precision, replicated, as rank 0 has them."""
        with torch.no_grad():
            for p in model.parameters():
                if id(p) not in trainable:
                    if p.is_floating_point():
                        p.data = p.data.to(self.dtype)
                    comm.broadcast_(p.data, what="broadcast of frozen parameters")
            for b in model.buffers():
                if b.is_floating_point():
                    b.data = b.data.to(self.dtype)
                comm.broadcast_(b.data, what="broadcast of buffers")

    def _flatten(self, params: list[torch.nn.Parameter], layout: FlatLayout, master: Any) -> list[torch.Tensor]:
        """Move parameters into flat buffers: fp32 master shards (written in partition order through the
        state store's `master` writer), working-precision full buffers.

        Masters come from the original fp32 values (broadcast from rank 0), not from their 16-bit cast.
        Stages 0-2 keep one contiguous working buffer; stage 3 needs one storage per unit to free it.
        """
        if self.stage < 3:
            self._flat_working = torch.empty(sum(g.padded_numel for g in layout.groups), dtype=self.dtype, device=self.device)
        full: list[torch.Tensor] = []
        start = 0
        with torch.no_grad():
            for g in layout.groups:
                staging = torch.zeros(g.padded_numel, dtype=torch.float32, device=self.device)
                for s in g.slots:
                    staging[s.offset : s.offset + s.numel].copy_(params[s.index].detach().reshape(-1))
                comm.broadcast_(staging, what=f"broadcast of rank 0's initial weights (group {g.index})")
                lo, hi = layout.shard_range(g.index, self.rank if layout.world_size > 1 else 0)
                master.write(staging[lo:hi])
                if self.stage < 3:
                    buf = self._flat_working[start : start + g.padded_numel]
                    start += g.padded_numel
                else:
                    buf = torch.empty(g.padded_numel, dtype=self.dtype, device=self.device)
                buf.copy_(staging)
                full.append(buf)
                for s in g.slots:
                    params[s.index].data = buf[s.offset : s.offset + s.numel].view(s.shape)
        master.close()
        return full

    # -- training ---------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.breakdown.forward_started()
        return self.module(*args, **kwargs)

    forward = __call__

    def is_gradient_accumulation_boundary(self) -> bool:
        """True when the next `step()` applies an update."""
        return (self.micro_steps + 1) % self.gradient_accumulation_steps == 0

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of `loss` scaled by the loss scale and 1/accumulation steps; reduces gradients."""
        self.wait_for_weights()  # buckets no module's forward read (unused parameters)
        boundary = self.is_gradient_accumulation_boundary()
        window_pos = self.micro_steps % self.gradient_accumulation_steps
        scale = self.scaler.inv_scale / self.world_size
        self.reducer.begin(reduce_now=self.stage >= 2 or boundary, accumulate=self.stage >= 2 and window_pos > 0, scale=scale,
                           final=boundary)
        (loss * (self.scaler.scale.squeeze() / self.gradient_accumulation_steps)).backward()
        self.breakdown.backward_done()
        self.reducer.finish()
        if self.gatherer is not None:
            self.gatherer.end_backward()

    def step(self) -> None:
        """At an accumulation boundary: clip, update, refresh the working weights; otherwise only count.

        A step whose gradients are not finite (on any rank) changes nothing and is counted in
        `skipped_steps`; with zero_core.max_consecutive_nonfinite = N, the N-th such step in a row
        raises NonFiniteError (on CUDA possibly one step later: the check never stalls the device).
        """
        boundary = self.is_gradient_accumulation_boundary()
        self.micro_steps += 1
        if boundary:
            if self._uploader is not None:
                self._uploader.begin()
            self.wait_for_weights()  # the update rewrites the shards the last gathers read
            self.optimizer.step(out=self._opt_out, publish=self._uploader,
                                after_segment=self._deferred.start if self._deferred is not None else None)
            self.scaler.update(self.optimizer.overflow)
            self._nonfinite_run.add_(1.0).mul_(self.optimizer.overflow.to(self._nonfinite_run.dtype))
            self._publish_working()
            self.global_step += 1
            self.overflow_log.poll(self.global_step)
            self.breakdown.end_step()

    def wait_for_weights(self) -> None:
        """Finish the weight all-gathers still in flight after `step()` (stages 1-2 start them per bucket
        and each module's forward waits for its own): call it before reading parameters outside a forward."""
        if self._deferred is not None:
            self._deferred.wait_all()

    def _start_gather(self, bucket: int) -> comm.PendingCollective:
        g = self.layout.groups[bucket]
        return comm.all_gather_flat_async(self._full[g.index], self._shard_view(g),
                                          what=f"all-gather of updated weights (bucket {g.index})")

    def refresh_working_weights(self) -> None:
        """Rewrite the working-precision weights from the fp32 masters (after loading a checkpoint)."""
        self.wait_for_weights()
        with torch.no_grad():
            for lo, hi, v in self.optimizer.states.stream(("master",), write_back=False):
                self._write_partition(lo, hi, v["master"])
            if self._uploader is not None:
                self._uploader.begin()
                self._uploader(0, self._opt_out.numel())
            self._publish_working()
            if self._deferred is not None:
                self._all_gather_weights()

    def _publish_working(self) -> None:
        """Make the updated working partition visible: copy it up from the host (the host step already
        queued its chunks: wait for them on the device), then gather or mark stale."""
        if self._uploader is not None:
            self._uploader.finish()  # and all-gathers the buckets not gathered yet (stages 1-2)
        else:
            if self._local is not None and self._opt_out is not self._local:
                self._local.copy_(self._opt_out, non_blocking=True)  # type: ignore[arg-type]
            if self.stage in (1, 2) and self._deferred is None:
                self._all_gather_weights()
        if self.gatherer is not None:
            self.gatherer.after_step()

    def _all_gather_weights(self) -> None:
        for g in self.layout.groups:
            self._all_gather_group(g)

    def _shard_view(self, g: Any) -> torch.Tensor:
        """This rank's shard of bucket `g` inside its full working buffer."""
        lo, hi = self.layout.shard_range(g.index, self.rank)
        return self._full[g.index][lo:hi]

    def _stage3_shard_source(self) -> Any:
        """Where stage-3 gathers read this rank's 16-bit shard of a unit: the 16-bit partition, or a cast
        of the fp32 master (zero_core.stage3_gather_from_master)."""
        if self._local is not None:
            local = self._local
            return lambda lo, hi: local[lo:hi]
        master, dtype = self.optimizer.master, self.dtype
        return lambda lo, hi: master[lo:hi].to(dtype)

    def _write_partition(self, lo: int, hi: int, values: torch.Tensor) -> None:
        """Write partition elements [lo, hi) of the working-precision output (one tensor or per-bucket views)."""
        if self._opt_out is None:
            return  # stage 3 gathering from the master: nothing to write
        if isinstance(self._opt_out, torch.Tensor):
            self._opt_out[lo:hi].copy_(values)
            return
        for g, view in zip(self.layout.groups, self._opt_out):
            a, b = max(lo, g.partition_offset), min(hi, g.partition_offset + g.shard_numel)
            if a < b:
                view[a - g.partition_offset : b - g.partition_offset].copy_(values[a - lo : b - lo])

    def _all_gather_group(self, g: Any) -> None:
        shard = (self._shard_view(g) if self._local is None
                 else self._local[g.partition_offset : g.partition_offset + g.shard_numel])
        comm.all_gather_flat(self._full[g.index], shard, what=f"all-gather of updated weights (bucket {g.index})")

    # -- state ------------------------------------------------------------------------------------
    def save_checkpoint(self, save_dir: str | os.PathLike, tag: str | None = None,
                        client_state: dict[str, Any] | None = None, keep_last: int | None = None) -> Path:
        """Collective: every rank writes its own partition; committed atomically; `latest` moves last.

        `client_state` (JSON-serialisable: data position, epoch, ...) comes back from `load_checkpoint`.
        `keep_last=k` prunes older complete checkpoints, never the newest.
        """
        from .checkpointing import save

        self.wait_for_weights()
        return save(self, save_dir, tag, client_state, keep_last)

    def load_checkpoint(self, load_dir: str | os.PathLike, tag: str | None = None) -> dict[str, Any]:
        """Collective: load any zbench checkpoint (any world size, any stage) into this engine; returns client_state."""
        from .checkpointing import load

        self.wait_for_weights()
        return load(self, load_dir, tag)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank's engine holds now, by kind and where: what the memory tables are made of."""
        def nbytes(t: torch.Tensor | None) -> int:
            return 0 if t is None else t.numel() * t.element_size()

        stored = [b for b in self._full if b.untyped_storage().size() > 0]  # stage 3 frees ungathered units
        parts = self.optimizer._parts.values()
        separate = self._local is not None and self._local.data_ptr() != self._full[0].data_ptr()
        return {
            "working_weights": sum(nbytes(b) for b in stored),
            "working_shard": nbytes(self._local) if separate else 0,  # a 16-bit copy of this rank's partition
            "optimizer_states": self.optimizer.states.numel * 12 if not self.offload_optimizer else 0,
            "gradients": sum(nbytes(p) for p in parts),
        }

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: the full fp32 state dict on CPU on every rank, keys as in `module.state_dict()`."""
        self.wait_for_weights()
        by_param: dict[int, torch.Tensor] = {}
        for g in self.layout.groups:
            shard = self.optimizer.states.read("master", g.partition_offset, g.partition_offset + g.shard_numel)
            if self.layout.world_size > 1:
                full = torch.empty(g.padded_numel, dtype=torch.float32, device=self.device)
                comm.all_gather_flat(full, shard.to(self.device), what=f"all-gather of fp32 weights for full_state_dict (group {g.index})")
            else:
                full = shard
            for s in g.slots:
                by_param[id(self.params[s.index])] = full[s.offset : s.offset + s.numel].view(s.shape).cpu().clone()
        out: dict[str, torch.Tensor] = {}
        for name, t in self.module.state_dict(keep_vars=True).items():
            if id(t) in by_param:
                out[name] = by_param[id(t)]
            else:
                t = t.detach().cpu()
                out[name] = t.float() if t.is_floating_point() else t.clone()
        return out

    @property
    def loss_scale(self) -> float:
        """Current loss scale (reads the device: a host sync)."""
        return float(self.scaler.scale.item())

    @property
    def skipped_steps(self) -> int:
        """Updates skipped for non-finite gradients so far (a host sync)."""
        return int(self.optimizer.skipped.item())

    def get_lr(self) -> float:
        """Learning rate of the last update (a host sync)."""
        return float(self.optimizer.lr.item())

    def close(self) -> None:
        """Detach the gradient hooks, stop the offload thread and free the NVMe state file. The engine
        cannot train afterwards. (Process exit frees the file too, however the process ends.)"""
        if self._deferred is not None:
            self._deferred.remove()
        self.reducer.remove()
        self.optimizer.close()

    def train(self, mode: bool = True) -> "Engine":
        self.module.train(mode)
        return self

    def eval(self) -> "Engine":
        return self.train(False)

"""Stage 3: weights sharded too. Each unit (a transformer block, or the root unit of everything outside the
blocks: units.py) has its own flat 16-bit buffer, allocated only while the unit is gathered.

Gradient path: as stage 2, per unit: each unit's bucket is reduce-scattered once complete, every
micro-step; once reduced, the unit's full weights are released (param_gather.py).

Where this rank's 16-bit shard of each unit comes from when it is gathered:
- by default, a cast of the fp32 master shard on the way (as FSDP2 does): no 16-bit partition at all;
- with `zero_core.stage3_gather_from_master: false`, or with optimizer offload, a 16-bit partition on
  the device, which the update writes (on the host, then uploaded chunk by chunk: optim/weight_upload.py);
- with parameter offload, that partition lives in pinned host memory (`offload_param.device: cpu`) or in a
  file mapping under `offload_param.nvme_path` ("nvme": param_file.py), and is copied up per unit.

With optimizer offload and `zero_core.overlap_weight_gather` (off by default) the host update runs on after
`step()` returns, and each unit's forward waits until the update has published its shard range
(host_step_overlap.py): uploaded into the device partition, or, where the partition lives on the host,
written there by the update itself.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import comm
from ..optim.weight_upload import WeightUploader
from .base import Stage
from .host_step_overlap import HostStepInFlight
from .param_file import param_file
from .param_gather import ParamGatherer


class PartitionedStage(Stage):
    contiguous = False

    def __init__(self, model, params, layout, cfg, rank, device, units: list) -> None:
        super().__init__(model, params, layout, cfg, rank, device)
        self.units = units
        off_param = cfg.zero_optimization.offload_param
        self.offload_param = off_param is not None and off_param.device in ("cpu", "nvme")
        self.param_nvme_path = off_param.nvme_path if off_param is not None and off_param.device == "nvme" else None
        self.gatherer: ParamGatherer | None = None
        self.initial_masters: Any = None  # a deferred model's shards: in the optimizer's masters only
        self.inflight: HostStepInFlight | None = None  # offload: the host update still running (host_step_overlap.py)

    def flatten_from_masters(self, states: Any) -> None:
        """A deferred model: the optimizer's masters already hold this rank's shards (deferred/shards.py).
        Each unit's working buffer is made without storage (it is gathered before use), one at a time."""
        self.initial_masters = states
        with torch.no_grad():
            for g in self.layout.groups:
                buf = torch.empty(g.padded_numel, dtype=self.dtype, device=self.device)
                self.full.append(buf)
                for s in g.slots:
                    self.params[s.index].data = buf[s.offset : s.offset + s.numel].view(s.shape)
                buf.untyped_storage().resize_(0)  # the views stay valid; gathering gives them storage again
        self.flat = torch.empty(0, dtype=self.dtype, device=self.device)

    def _initial_shard(self, g: Any) -> torch.Tensor:
        if self.initial_masters is not None:
            return self.initial_masters.read("master", g.partition_offset, g.partition_offset + g.shard_numel)
        lo, hi = self.layout.shard_range(g.index, self.rank)
        return self.full[g.index][lo:hi]

    def attach(self, optimizer: Any, breakdown: Any) -> None:
        layout, zero = self.layout, self.cfg.zero_optimization
        if not optimizer.on_host and not self.offload_param and self.cfg.zero_core.stage3_gather_from_master:
            master, dtype = optimizer.states.master, self.dtype  # the update keeps only the fp32 master
            shard_of = lambda lo, hi: master[lo:hi].to(dtype)  # noqa: E731
        else:
            self.local = self._partition_buffer()
            for g in layout.groups:
                self.local[g.partition_offset : g.partition_offset + g.shard_numel].copy_(self._initial_shard(g))
            self.output = self._output_for(optimizer)
            if self.output is not self.local:
                self.output.copy_(self.local)
            if self.output.device.type == "cpu" and self.local.is_cuda:  # host update: upload chunk by chunk
                self.uploader = WeightUploader(self.output, [(0, self.local)], breakdown)
                self.publish_chunk = self.uploader
            if optimizer.on_host:
                optimizer.bind_device_output(self.local)  # a share kept on the device writes here (ratio < 1)
            local = self.local
            shard_of = lambda lo, hi: local[lo:hi]  # noqa: E731
        self.gatherer = ParamGatherer(
            self.units,
            layout,
            self.full,
            shard_of,
            persistence_threshold=zero.stage3_param_persistence_threshold,
            prefetch_numel=zero.stage3_prefetch_bucket_size,
            max_live_numel=zero.stage3_max_live_parameters,
            max_reuse_numel=zero.stage3_max_reuse_distance,
            side=comm.SideStream(self.device),  # its own stream: prefetches must not queue behind reductions
            params=self.params,
            root=self.model,
        )
        self.initial_masters = None
        if optimizer.on_host and self.cfg.zero_core.overlap_weight_gather:
            self._overlap_host_update(optimizer, breakdown)

    def _overlap_host_update(self, optimizer: Any, breakdown: Any) -> None:
        """Let the host update run on after `step()`; each unit's forward waits for its own shard range, and
        prefetches stop at the first unit not yet published."""
        assert self.gatherer is not None
        ends = [g.partition_offset + g.shard_numel for g in self.layout.groups]
        inflight = HostStepInFlight(self.units, ends, self.model, breakdown, uploader=self.uploader)
        if not optimizer.run_host_update_with(inflight.launch):  # the delayed update has a thread of its own
            inflight.remove()
            return
        self.inflight, self.publish_chunk = inflight, inflight.publish
        self.gatherer.ready = lambda g: inflight.ready((g,))
        self.gatherer.wait_for = lambda g: inflight.wait((g,))

    def _partition_buffer(self) -> torch.Tensor:
        """Where this rank's 16-bit partition lives: a file mapping (param_file.py), pinned host memory, or the
        device."""
        numel = self.layout.partition_numel
        if self.param_nvme_path is not None:
            return param_file(numel, self.dtype, self.param_nvme_path, self.rank)
        if self.offload_param:
            return comm.host_buffer(numel, self.dtype, pin=True)
        return torch.empty(numel, dtype=self.dtype, device=self.device)

    def _output_for(self, optimizer: Any) -> torch.Tensor:
        """Where the update writes its 16-bit output: the partition itself where the states live beside it,
        else a buffer on the states' side that is copied across after the update."""
        assert self.local is not None
        state_device = torch.device("cpu") if optimizer.on_host else self.device
        if self.local.device == state_device:
            return self.local
        if state_device.type == "cpu":
            return comm.host_buffer(self.layout.partition_numel, self.dtype, pin=True)
        return torch.empty(self.layout.partition_numel, dtype=self.dtype, device=state_device)

    def hold(self, groups: list[int]) -> None:
        assert self.gatherer is not None
        self.wait_for_weights()
        self.gatherer.hold(groups)

    def let_go(self, groups: list[int]) -> None:
        assert self.gatherer is not None
        self.gatherer.let_go(groups)

    def guard_state_dict(self, world_size: int) -> None:
        """module.state_dict() returns current weights or refuses: each rank holds only its shards."""

        def before_state_dict(module: torch.nn.Module, prefix: str, keep_vars: bool) -> None:
            assert self.gatherer is not None
            held = all(r > 0 for r in self.gatherer.refs)
            if keep_vars or held:  # parameter objects, not values (the engine's own bookkeeping), or gathered
                return
            if world_size > 1:
                raise ValueError(  # a refusal: one line when uncaught (refusal_hook.py)
                    f"module.state_dict() at ZeRO stage 3 on {world_size} ranks: each rank holds "
                    "1/N of the weights. Call engine.full_state_dict() or engine.save_16bit_model(dir) "
                    "on every rank, or read them inside zero_core.deepspeed.zero.GatheredParameters("
                    "model.parameters())"
                )
            self.gatherer.gather_all()  # one rank: gathering needs no peer

        self.model.register_state_dict_pre_hook(before_state_dict)

    def on_group_reduced(self, g: int) -> None:
        assert self.gatherer is not None
        self.gatherer.on_group_reduced(g)

    def after_backward(self) -> None:
        assert self.gatherer is not None
        self.gatherer.end_backward()

    def begin_update(self) -> None:
        self.wait_for_weights()  # the last update published and read before the next one rewrites the shards
        if self.uploader is not None:
            self.uploader.begin()
        if self.inflight is not None:
            self.inflight.begin()

    def finish_update(self) -> None:
        if self.inflight is not None:
            self.inflight.end_step()  # each unit's forward waits for what the update's thread publishes
        elif self.uploader is not None:
            self.uploader.finish()
        elif self.local is not None and self.output is not self.local:
            self.local.copy_(self.output, non_blocking=True)
        assert self.gatherer is not None
        self.gatherer.after_step(self.inflight is not None and self.inflight.running)  # gathered copies are stale

    def wait_for_weights(self) -> None:
        if self.inflight is not None:
            self.inflight.finish()

    def close(self) -> None:
        if self.inflight is not None:
            self.inflight.remove()

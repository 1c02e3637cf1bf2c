"""The Engine: one object that trains any nn.Module at ZeRO stage 0, 1, 2 or 3.

It is a facade over three pieces that each own one decision:
- the stage strategy (stages/): parameter order and layout, the gradient collective, where 16-bit weights live and
  how updated weights reach the model;
- the optimizer (optim/): where the fp32 master and moments live (device, host memory, NVMe) and its update;
- the gradient reducer (stages/grad_buckets.py): hooks that bucket gradients, reduced, for the optimizer.
"""

from __future__ import annotations

from typing import Any

import torch

from . import comm
from .checkpoint_async import saver_of
from .checkpoint_snapshot import reserve_for
from .buffer_dtypes import buffer_targets
from .config import ZeroConfig, describe, load_config
from .config_passed_objects import passed_objects_win
from .deferred import built_converted, is_deferred
from .deferred.shards import materialise_whole, shard_into
from .engine_api import DeepSpeedEngineAPI
from .engine_backward import BackwardPass
from .engine_torch_backward import watch_outputs
from .engine_monitor import write_update_events
from .engine_modes import EngineModes
from .engine_wall_clock import wall_clock
from .engine_queries import EngineQueries, LossScaleValue, given_dict, with_items
from .gathered import register as register_parameters
from .loss_scaler import LossScaler
from .host_schedules import GroupLrs, LrWrites, make_schedules
from .optim import make_optimizer, offloads_optimizer
from .optim.facade import EngineScheduler, ZeroOptimizer
from .optim.group_values import follow_group_values
from .optim.param_groups import plan_optimizer
from .optim.state_view import expose_state
from .optim.affinity import ENV as PIN_ENV
from .optim.affinity import describe as describe_cpus, pin_rank, size_team
from .overflow_log import OverflowLog
from .stages import make_stage
from .stages.grad_buckets import GradReducer
from .step_timer import StepBreakdown, enabled_for


class Engine(EngineModes, BackwardPass, torch.nn.Module, DeepSpeedEngineAPI, EngineQueries):
    """Wraps a model for ZeRO data-parallel training; build it with `zero_core.initialize`. Like DeepSpeed's
    engine it is a Module holding the model as `module`: calling it runs the model's forward."""

    training_refused: str | None = None  # why backward() is refused (deepspeed.initialize without any optimizer)
    last_step_updated = False  # whether the last step() was a boundary's (was_step_applied)

    def __getattr__(self, name: str) -> Any:
        """The model's own attributes where the engine has none, as DeepSpeed's engine passes them through:
        `engine.generate(...)`, `engine.gradient_checkpointing_enable()`, `engine.config` stays the engine's."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self._modules.get("module")
            if module is None or name.startswith("__"):
                raise
            try:
                return getattr(module, name)
            except AttributeError:
                raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'") from None

    def __init__(self, model: torch.nn.Module, config: dict | str | ZeroConfig, *, model_parameters: Any = None,
                 optimizer: Any = None, lr_scheduler: Any = None, auto: Any = None) -> None:
        super().__init__()
        self.device = comm.pick_device()
        comm.ensure_process_group(self.device)
        self.world_size, self.rank = comm.world_size(), comm.rank()
        cfg = passed_objects_win(load_config(config, self.world_size, auto=auto), optimizer, lr_scheduler, self.rank)
        cfg = with_items(cfg, given_dict(config))
        self.config: ZeroConfig = cfg
        self._announce()
        self.stage, self.dtype = cfg.stage, cfg.dtype
        self.global_step = self.micro_steps = 0
        self.steps_not_applied = 0  # optimizer steps counted without this optimizer (loaded without its states)
        self.norm_taken = False  # a step of this engine computed the gradient norm (get_global_grad_norm)
        self._boundary_set, self._window_passes = None, 0  # set_gradient_accumulation_boundary; backwards since a step
        self.gradients_ready = False  # a window's last backward has run and its step has not (safe_get_full_grad)
        deferred = is_deferred(model)  # built inside zero_core.init_context, or on meta
        # init_context's buffers take the working precision; zero.Init's keep their dtypes, as DeepSpeed's
        built_in_context = deferred and not built_converted(model)
        if deferred and self.stage != 3:  # stages 0-2 hold every weight anyway
            materialise_whole(model)
            deferred = False
        self.module = model if deferred else model.to(self.device)
        plan = plan_optimizer(model, cfg, model_parameters, optimizer)
        self._client_given = plan.client
        group_of = plan.group_of()
        self.strategy = make_stage(model, cfg, self.world_size, self.rank, self.device, group_of)
        self.layout, self.params = self.strategy.layout, self.strategy.params
        self.offload_optimizer = offloads_optimizer(cfg)
        self.pinned_cpus = self._pin()
        self.breakdown = StepBreakdown(self.device, enabled_for(self.offload_optimizer))  # step-time breakdown
        self.optimizer = make_optimizer(cfg, self.layout, self.device, self.rank, self.breakdown, plan,
                                        [group_of[id(p)] for p in self.params])
        self.client_optimizer = self.optimizer.facade = plan.client or ZeroOptimizer(plan, self)  # handed back
        expose_state(self)  # engine.optimizer.state: the handed-back optimizer's, as DeepSpeed's are one object
        self.host_schedule, self.lr_scheduler = make_schedules(cfg, plan, lr_scheduler, self.client_optimizer, self)
        follow_group_values(self)  # a loop's writes of weight_decay, eps, betas into the groups apply, as in torch
        if self.host_schedule is not None:
            self.optimizer.lr_at = None  # the host schedule writes each update's lrs
        elif isinstance(self.lr_scheduler, EngineScheduler):  # the config's device schedule, at its position
            self.optimizer.lr_at = self.lr_scheduler.shifted(self.optimizer.lr_at)
        no_schedule = self.host_schedule is None and self.lr_scheduler is None
        self._lr_writes = LrWrites(self.client_optimizer) if no_schedule else None  # until the loop sets an lr
        if deferred:  # each rank computes every weight once, in construction order, and keeps its shards
            shard_into(model, self.layout, self.params, self.rank, self.device, self.dtype, self.optimizer.states)
            self.strategy.flatten_from_masters(self.optimizer.states)
        else:
            self.strategy.flatten(self.optimizer.states.writer())
        self._cast_frozen_and_buffers(model, {id(p) for p in self.params}, built_in_context)
        self.scaler = self.optimizer.scaler = LossScaler(cfg, self.optimizer.states.device)
        if isinstance(self.client_optimizer, ZeroOptimizer):
            self.client_optimizer.scaler = self.scaler  # both answer `loss_scale` / `cur_scale` as DeepSpeed's do
        if isinstance(self.lr_scheduler, EngineScheduler):  # the first update's lr, as DeepSpeed's scheduler writes it
            self.lr_scheduler.publish()
        self.strategy.attach(self.optimizer, self.breakdown)
        side = comm.SideStream(self.device, enabled=cfg.zero_optimization.overlap_comm or self.stage == 3)
        self.reducer = GradReducer(self.params, self.layout, self.optimizer, self.strategy, comm_dtype=cfg.comm_dtype,
                                   side=side, device=self.device)
        # consecutive optimizer steps with non-finite gradients, on the device (the hot loop never reads it)
        self._nonfinite_run = torch.zeros(1, dtype=torch.float32, device=self.optimizer.states.device)
        self.overflow_log = OverflowLog(self.optimizer.skipped, self.scaler, self._nonfinite_run,
                                        cfg.zero_core.max_consecutive_nonfinite)
        if self.stage == 3:
            self.strategy.guard_state_dict(self.world_size)
        register_parameters(self)  # for GatheredParameters
        watch_outputs(self)  # DeepSpeed's torch-style backward: engine.scale(loss).backward(), loss.backward()
        if cfg.zero_core.async_checkpoint:  # pinning the async save's host buffers takes seconds: start it now
            reserve_for(self, saver_of(self).buffers)

    def _announce(self) -> None:
        if self.config.zero_core.comm_timeout_s is not None:
            comm.set_timeout(self.config.zero_core.comm_timeout_s)
        if self.rank == 0:
            print(f"zero_core: resolved config (world size {self.world_size}):\n{describe(self.config)}", flush=True)

    def _pin(self) -> list[int] | None:
        """This rank's own cores with optimizer offload (None: not pinned), and its host threads."""
        cpus = pin_rank(self.offload_optimizer)
        threads = size_team(cpus, self.offload_optimizer and self.device.type == "cuda")
        if cpus and self.rank == 0:
            print(f"zero_core: local rank 0 pinned to cpus {describe_cpus(cpus)}, "
                  f"{threads} threads ({PIN_ENV}=0 turns this off)", flush=True)
        return cpus

    def _cast_frozen_and_buffers(self, model: torch.nn.Module, trainable: set[int], built_in_context: bool) -> None:
        """Frozen parameters run in the working precision and floating buffers in the dtype buffer_dtypes.py gives
        them, replicated, as rank 0 has them."""
        targets = buffer_targets(model, self.config, built_in_context)
        with torch.no_grad():
            for p in model.parameters():
                if id(p) not in trainable:
                    if p.is_floating_point():
                        p.data = p.data.to(self.dtype)
                    comm.broadcast_(p.data, what="broadcast of frozen parameters")
            for b in model.buffers():
                if id(b) in targets:
                    b.data = b.data.to(targets[id(b)])
                comm.broadcast_(b.data, what="broadcast of buffers")

    # -- training ---------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.breakdown.forward_started()
        return wall_clock(self).forward(self.module, *args, **kwargs)  # timed with wall_clock_breakdown

    def step(self, lr_kwargs: dict | None = None) -> None:
        """At an accumulation boundary: clip, update, refresh the working weights; otherwise only count.

        A step whose gradients are not finite (on any rank) changes nothing and is counted in
        `skipped_steps`; with zero_core.max_consecutive_nonfinite = N, the N-th such step in a row
        raises NonFiniteError (on CUDA possibly one step later: the check never stalls the device).
        """
        if lr_kwargs:
            raise NotImplementedError("engine.step(lr_kwargs=...) is not supported by zero_core; its schedules take no "
                                      "arguments at the step (set the lr in the scheduler or the optimizer's groups)")
        boundary = self.is_gradient_accumulation_boundary()
        if boundary and not self.gradients_ready:  # DeepSpeed's fails inside; an update from no gradients would
            raise ValueError(  # still decay the weights and move the moments
                "engine.step() ends an accumulation window whose last backward did not run; call "
                "engine.backward(loss) before each engine.step()")
        wall_clock(self).step_started(boundary)
        self.micro_steps += 1
        self.last_step_updated = boundary  # was_step_applied(): only a boundary's step updates
        if boundary:
            self._window_passes, self.gradients_ready = 0, False
            if self._lr_writes is not None and self._lr_writes.written():  # the loop set an lr: read it from now on
                self.optimizer.lr_at, self.host_schedule, self._lr_writes = None, GroupLrs(self.client_optimizer), None
            if isinstance(self.lr_scheduler, EngineScheduler):  # an lr the loop wrote: the next update's, as DeepSpeed
                self.lr_scheduler.take_writes()
            if self.host_schedule is not None:
                self._apply_host_schedule()
            s = self.strategy
            s.begin_update()
            self.optimizer.step(out=s.output, publish=s.publish_chunk, after_segment=s.after_segment)
            self.scaler.update(self.optimizer.overflow)
            self._nonfinite_run.add_(1.0).mul_(self.optimizer.overflow.to(self._nonfinite_run.dtype))
            wall_clock(self).gather_started()
            s.finish_update()
            self.global_step, self.norm_taken = self.global_step + 1, True
            if self.host_schedule is not None and not self.scaler.dynamic:  # step a torch scheduler now, as DeepSpeed
                self.host_schedule.values(self.applied_steps())  # (under fp16 it catches up at the next update or read)
            if isinstance(self.lr_scheduler, EngineScheduler):  # the next lr into the groups, as DeepSpeed's step()
                self.lr_scheduler.publish()
            write_update_events(self)  # DeepSpeed's per-update monitor events (nothing when the monitor is off)
            self.overflow_log.poll(self.global_step)
            self.breakdown.end_step()
            if getattr(self.optimizer, "auto", None) is not None:
                self._settle_offload_ratio()
        wall_clock(self).step_done(boundary)

    def _settle_offload_ratio(self) -> None:
        """offload_optimizer.ratio "auto": the first step is measured; move the device share that fits."""
        auto, self.optimizer.auto = self.optimizer.auto, None
        self.wait_for_weights()  # the first update done before its states move
        self.optimizer = self.reducer.opt = auto.settle(self.optimizer)
        self.optimizer.scaler = self.scaler
        expose_state(self)
        if self.rank == 0:
            print(f"zero_core: offload_optimizer.ratio auto: {getattr(self.optimizer, 'split', 0):,} of "
                  f"{self.optimizer.states.numel:,} partition elements keep their optimizer states on the device",
                  flush=True)

    def applied_steps(self) -> int:
        """Updates applied so far (skipped fp16 steps excluded): a host sync only under dynamic loss scaling,
        where steps are skipped as a matter of course; otherwise every optimizer step of this optimizer counts."""
        return int(self.optimizer.applied.item()) if self.scaler.dynamic else self.global_step - self.steps_not_applied

    def _apply_host_schedule(self) -> None:
        assert self.host_schedule is not None
        lrs, betas = self.host_schedule.values(self.applied_steps())
        host = torch.tensor(lrs, dtype=torch.float32)
        self.optimizer.lr.copy_(host.pin_memory() if self.optimizer.lr.is_cuda else host, non_blocking=True)
        for group, (beta1, beta2) in zip(self.optimizer.groups, betas or ()):
            group.beta1, group.beta2 = beta1, beta2
        for group, lr in zip(self.client_optimizer.param_groups, lrs):  # readers of the optimizer's groups
            group["lr"] = lr

    def _drain_updates(self) -> None:
        """Before states are read or replaced: undo host updates speculated in this backward (the step redoes
        them); apply and send a delayed update (zero_core.offload_delayed_update) still running on the host."""
        self.optimizer.undo_speculation()
        if getattr(self.optimizer, "pending", False):
            s = self.strategy
            s.begin_update()
            self.optimizer.drain(s.output, s.publish_chunk)
            s.finish_update()

    def wait_for_weights(self) -> None:
        """Finish the weight all-gathers and the host update still in flight after `step()` (stages 1-2 start
        the gathers per bucket; with optimizer offload the update runs on, stages 1-3; each module's forward waits
        for its own): call it before reading parameters or optimizer states outside a forward."""
        self.strategy.wait_for_weights()

    def refresh_working_weights(self) -> None:
        """Rewrite the working-precision weights from the fp32 masters (after loading a checkpoint)."""
        with torch.no_grad():
            self.strategy.reload(self.optimizer.states)

    # -- state (save_checkpoint / load_checkpoint: engine_api.py) --------------------------------
    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank's engine holds now, by kind and where: what the memory tables are made of."""
        stored = [b for b in self.strategy.full if b.untyped_storage().size() > 0]  # stage 3 frees ungathered units
        return {
            "working_weights": sum(b.numel() * b.element_size() for b in stored),
            "working_shard": self.strategy.working_shard_bytes(),  # a 16-bit copy of this rank's partition
            "optimizer_states": self.optimizer.device_state_numel() * 12,  # partial offload: the device share
            "gradients": self.optimizer.live_gradient_bytes(),
        }

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: the full fp32 state dict on CPU on every rank, keys as in `module.state_dict()`."""
        from .model_export import full_state_dict

        return full_state_dict(self)

    @property
    def loss_scale(self) -> LossScaleValue:
        """Current loss scale (reads the device: a host sync); called, as DeepSpeed's `engine.loss_scale()`, the
        config's static fp16 loss scale (0.0 when dynamic or unset)."""
        return LossScaleValue(float(self.scaler.scale.item()), self.config.fp16.loss_scale)

    @property
    def skipped_steps(self) -> int:
        """Updates skipped for non-finite gradients so far (a host sync)."""
        return int(self.optimizer.skipped.item())

    def close(self) -> None:
        """Detach the gradient hooks, stop the offload thread and free the NVMe state file. The engine
        cannot train afterwards. (Process exit frees the file too, however the process ends.)"""
        self._drain_updates()
        self.strategy.close()
        self.reducer.remove()
        self.optimizer.close()

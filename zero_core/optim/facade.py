"""What `initialize` hands back as the optimizer and the scheduler, for code written against torch and
DeepSpeed: they hold the groups and answer the usual calls; the engine does the work.

- `ZeroOptimizer` is a real `torch.optim.Optimizer` over the model's parameters with the groups'
  hyper-parameters, so a torch scheduler can be built on it (`lr_scheduler=lambda opt: LambdaLR(opt, ...)`)
  and readers of `optimizer.param_groups[0]["lr"]` work; `loss_scale` / `cur_scale` read the engine's scale, as
  on DeepSpeed's ZeRO optimizers. `step()` refuses (the engine steps), `zero_grad()` does nothing (the engine
  frees gradients as it reduces them). `state` is this rank's Adam states per parameter (optim/state_view.py).
- `EngineScheduler` stands for the config's "scheduler" section, as DeepSpeed's scheduler object: the engine
  steps it after every applied update, and a `step()` of the script's own moves it one iteration further, as
  it does in DeepSpeed (a loop calling both `engine.step()` and `scheduler.step()` advances it twice per step).
  Each move writes the next update's lr (and OneCycle's betas) into the optimizer's groups; an lr (or betas) the
  loop writes there in between is taken by the next update alone, as in DeepSpeed, whose scheduler then
  overwrites it at its next step.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable

import torch

from ..host_schedules import checked_betas
from ..loss_scaler import ReportsLossScale
from .loop_writes import GroupWrites
from .param_groups import OptimizerPlan
from .state_view import PartitionState


class ZeroOptimizer(ReportsLossScale, torch.optim.Optimizer):
    def __init__(self, plan: OptimizerPlan, engine: Any = None) -> None:
        self._engine = weakref.ref(engine) if engine is not None else lambda: None  # no cycle: the engine holds us
        groups = [{"params": g.params, "lr": g.lr, "betas": g.betas, "eps": g.eps, "weight_decay": g.weight_decay}
                  for g in plan.groups]
        super().__init__(groups, defaults={"lr": plan.groups[0].lr, "betas": plan.groups[0].betas,
                                           "eps": plan.groups[0].eps, "weight_decay": plan.groups[0].weight_decay})

    # Under fp16 on a GPU the scheduled lr depends on which steps were skipped, a device count: the groups are
    # then brought up to date when they are read, not after every step (which would stall the device).
    stale: Callable[[], None] | None = None

    @property
    def param_groups(self) -> list[dict]:  # type: ignore[override]
        refresh, self.stale = self.stale, None
        if refresh is not None:
            refresh()
        return self.__dict__["param_groups"]

    @param_groups.setter
    def param_groups(self, groups: list[dict]) -> None:
        self.__dict__["param_groups"] = groups  # where torch's __setstate__ puts them too

    @property
    def state(self) -> PartitionState:  # type: ignore[override]
        """This rank's Adam states per parameter, read from where they live (optim/state_view.py)."""
        if "_state_view" not in self.__dict__:
            self.__dict__["_state_view"] = PartitionState(self._engine)
        return self.__dict__["_state_view"]

    @state.setter
    def state(self, value: Any) -> None:
        if "param_groups" in self.__dict__:  # torch's __init__ sets an empty one first: nothing to keep
            raise ValueError("optimizer.state is a view of the engine's optimizer states and cannot be replaced; "
                             "change a parameter's state with deepspeed.utils.safe_set_local_optimizer_state")

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        raise RuntimeError("optimizer.step() is the engine's job: call engine.step() after engine.backward(loss)")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: the engine releases each gradient once it is reduced."""

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """This rank's partition of the optimizer states, plain CPU tensors (optim/partition_state.py)."""
        from .partition_state import partition_state_dict

        return partition_state_dict(self._engine(), self.param_groups)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """What `state_dict()` returned on this same partition (same stage, world size and rank)."""
        from .partition_state import load_partition_state_dict

        load_partition_state_dict(self._engine(), state_dict, self.param_groups)


class EngineScheduler:
    """The config's schedule, seen as DeepSpeed's scheduler object. Its position (DeepSpeed's
    `last_batch_iteration`) is the config's starting iteration plus the updates applied plus the steps the script
    took itself (`extra`); the engine evaluates its lrs there (lr_schedules.py, host_schedules.OneCycle)."""

    def __init__(self, engine: Any, start: int) -> None:
        self._engine, self._start = engine, start
        self.extra = 0
        self._loaded: int | None = None  # the position a checkpoint being loaded saved, for after_load
        self._loaded_lrs: list[float] | None = None  # the lrs its optimizer's groups held, where it recorded them
        self._loaded_betas: list[tuple[float, float]] | None = None  # and their (beta1, beta2), where it has them
        self._betas_before: list[tuple[float, float]] | None = None  # the betas the groups held before that load
        # (applied count, lrs, betas or None): what a load left in the groups for the update after that many applied
        # updates, as DeepSpeed's groups keep a loaded optimizer's lrs and betas until its scheduler next steps
        self._held: tuple[int, list[float], list[tuple[float, float]] | None] | None = None
        self._held_on: dict[torch.device, torch.Tensor] = {}
        self._held_by_loop = False  # `_held` is what the loop wrote into the groups (not a load's)
        self._writes = GroupWrites(engine.client_optimizer)

    @property
    def last_batch_iteration(self) -> int:
        return self._start + self._engine.applied_steps() + self.extra

    def shifted(self, lr_at: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """The device schedule `lr_at(applied)` (lr_schedules.py) at this scheduler's position instead."""

        def at(applied: torch.Tensor, *out: torch.dtype) -> torch.Tensor:
            self._take_writes()
            lrs = lr_at(applied + self.extra, *out)
            if self._held is None:
                return lrs
            held = self._held_on.get(lrs.device)
            if held is None:
                held = self._held_on[lrs.device] = torch.tensor(self._held[1], dtype=torch.float64).to(lrs.device)
            # the count compared on the device: no host sync in the step
            return torch.where(applied.reshape(-1)[:1] == self._held[0], held.to(lrs.dtype), lrs)

        return at

    def held_values(self, applied: int) -> tuple[list[float], list[tuple[float, float]] | None] | None:
        """The lrs and betas (None: the schedule's) a load or the loop left in the groups, where the update after
        `applied` applied updates takes them."""
        self._take_writes()
        return self._held[1:] if self._held is not None and self._held[0] == applied else None

    def take_writes(self) -> None:
        """An lr or betas the loop wrote into the groups since the last publish(): the next update takes them (read
        once per update, on the host; the applied count is read only when the loop wrote). engine.step calls it
        before the update, so that a bad lr (not a finite number >= 0) is refused in one line before it runs."""
        written = self._writes.written()
        if written is not None:
            self._held, self._held_on, self._held_by_loop = (self._engine.applied_steps(), *written), {}, True

    def _take_writes(self) -> None:
        """The same where the lr is only read (get_lr, a host update started during backward on another thread):
        a bad lr is left to the step to refuse, the schedule's lr answers meanwhile."""
        try:
            self.take_writes()
        except ValueError:
            pass

    def saved_position(self, state: Any, lrs: Any = None, betas: Any = None) -> None:
        """A loaded checkpoint's scheduler state: DeepSpeed's `{"last_batch_iteration": n}` (zbench saves the same),
        or, from a DeepSpeed checkpoint, `{"scheduler": {...}}`; without one the applied count gives the position.
        `lrs`, `betas`: what its optimizer's groups held for the next update (a zbench save records the lrs, a
        DeepSpeed checkpoint's optimizer state both)."""
        inner = state.get("scheduler", state) if isinstance(state, dict) else None
        to = inner.get("last_batch_iteration") if isinstance(inner, dict) else None
        self._loaded = to if isinstance(to, int) and not isinstance(to, bool) and to >= -1 else None
        fits = isinstance(lrs, list) and len(lrs) == len(self._engine.optimizer.groups) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in lrs)
        self._loaded_lrs = [float(x) for x in lrs] if fits else None
        self._loaded_betas = checked_betas(betas, len(self._engine.optimizer.groups))
        self._betas_before = self._next_betas()  # called before the load moves the counts

    def _next_betas(self) -> list[tuple[float, float]] | None:
        """The betas this schedule writes for the next update (None: it sets none, the optimizer's own hold)."""
        e = self._engine
        return e.host_schedule.values(e.applied_steps())[1] if e.host_schedule is not None else None

    def after_load(self, schedule: bool, optimizer: bool, applied_before: int, lrs_before: list[float]) -> None:
        """engine.load_checkpoint, as DeepSpeed's: with `schedule` the saved position (the checkpoint's applied count
        where it saved none and the optimizer was loaded), else the position it had. The next update takes the lrs
        the groups then hold: with `optimizer` the saved groups' (where the save recorded none, this schedule's at
        the saved position), else those of before the load (`lrs_before`), and so do OneCycle's betas; the scheduler's
        next step writes its own."""
        loaded, saved_lrs, saved_betas = self._loaded, self._loaded_lrs, self._loaded_betas
        # a load of the module alone moves no count and gives no saved position: the betas are still those of before
        betas_before = self._betas_before if self._betas_before is not None else self._next_betas()
        self._loaded = self._loaded_lrs = self._loaded_betas = self._betas_before = None
        if schedule and (loaded is not None or optimizer):
            self.extra = 0
            if loaded is not None:
                self.extra = loaded - self.last_batch_iteration
        else:
            self.extra += applied_before - self._engine.applied_steps()
        self._held, self._held_on = None, {}
        held, held_betas = (lrs_before, betas_before) if not optimizer else (saved_lrs, saved_betas)
        if optimizer and loaded is not None and (held is None or held_betas is None):
            # what the saved groups held, where the checkpoint does not say: this schedule's at the saved position
            at_lrs, at_betas = self._values_at(loaded)
            held = held if held is not None or schedule else at_lrs
            held_betas = held_betas if held_betas is not None else at_betas
        self._held_by_loop = False
        if held is not None:
            self._held = (self._engine.applied_steps(), [float(x) for x in held], held_betas)
        self.publish()

    def _values_at(self, position: int) -> tuple[list[float], list[tuple[float, float]] | None]:
        """This schedule's lrs and betas (None: it sets none) at `position` (DeepSpeed's groups after its scheduler
        stepped there)."""
        extra = self.extra
        self.extra += position - self.last_batch_iteration
        try:
            return self._engine.get_lr(), self._next_betas()
        finally:
            self.extra = extra

    def step(self, last_batch_iteration: int | None = None, batch_iteration: int | None = None) -> None:
        """One iteration further (or to the one given: `batch_iteration` is OneCycle's name for it), its lr
        written into the groups, as DeepSpeed's scheduler does."""
        to = last_batch_iteration if last_batch_iteration is not None else batch_iteration
        if to is None:
            self._held = None
            self.extra += 1
            self.publish()
        else:
            self._move(to)

    def _move(self, to: Any) -> None:
        if isinstance(to, bool) or not isinstance(to, int) or to < -1:
            raise ValueError(f"the scheduler's last_batch_iteration must be an integer >= -1, got {to!r}")
        self._held = None
        self.extra += to - self.last_batch_iteration
        self.publish()

    def get_last_lr(self) -> list[float]:
        """The lrs of the next update, as a stepped DeepSpeed scheduler reports them (a host sync): the schedule's,
        not an lr the loop wrote into the groups since (engine.get_lr() reports that one, as in DeepSpeed)."""
        self._take_writes()
        held = self._held
        if held is None or not self._held_by_loop:
            return self._engine.get_lr()
        self._held = None
        try:
            return self._engine.get_lr()
        finally:
            self._held = held

    get_lr = get_last_lr

    def state_dict(self) -> dict[str, Any]:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go to a saved position (a checkpoint's own schedule is restored by engine.load_checkpoint)."""
        self._move(state.get("last_batch_iteration") if isinstance(state, dict) else None)

    def publish(self) -> None:
        """After a move: the lrs (and OneCycle's betas) of the next update into the optimizer's groups (lazily where
        that needs the device's count of applied updates and the groups can wait until they are read)."""
        e, opt = self._engine, self._engine.client_optimizer
        self._writes.seen()  # an lr the loop wrote and no update took is overwritten, as DeepSpeed's step does
        if self._held is not None and not e.scaler.dynamic and e.applied_steps() != self._held[0]:
            self._held = None  # an update took the loaded lrs (the count is on the host here)
        if e.scaler.dynamic and self._count_on_device() and isinstance(opt, ZeroOptimizer):
            opt.stale = self._write
        else:
            self._write()

    def _count_on_device(self) -> bool:
        """Whether reading the applied-update count waits for the device."""
        return self._engine.optimizer.applied.is_cuda

    def _write(self) -> None:
        e, betas = self._engine, None
        if e.host_schedule is not None:
            lrs, betas = e.host_schedule.values(e.applied_steps())
        elif e.scaler.dynamic or not self._count_on_device():
            lrs = e.get_lr()
        else:  # every step counts as applied: the count is on the host, no device sync
            lrs = e.optimizer.lr_at(torch.tensor([float(e.applied_steps())]), torch.float64).tolist()
        groups = e.client_optimizer.param_groups
        for group, lr in zip(groups, lrs):
            group["lr"] = float(lr)
        for group, pair in zip(groups, betas or ()):
            if "betas" in group:  # DeepSpeed's OneCycle leaves an optimizer without betas alone
                group["betas"] = pair
        self._writes.seen()


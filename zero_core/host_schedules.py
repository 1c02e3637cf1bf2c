"""Schedules evaluated on the host, once per update, as DeepSpeed evaluates them: OneCycle (which also
cycles beta1 and sets beta2 0.99), LRRangeTest (config_host_schedules.py), the caller's torch LRScheduler, or a
`lambda step: lr`.

Each gives the lr of every group (and, for momentum cycling, its (beta1, beta2)) for the update that follows
`applied` applied updates. The engine copies the lrs to the device without waiting for it. Only
whether the last step was applied needs the device: under dynamic loss scaling (fp16), where steps
are skipped as a matter of course, the engine reads the applied count (one host sync per step);
otherwise every step counts as applied, as only a NaN/inf would skip one.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import torch

from .config_models import SchedulerParams


Betas = list[tuple[float, float]]  # (beta1, beta2) per group


class HostSchedule:
    """Base: `values(applied)` -> (lr per group, (beta1, beta2) per group or None: the optimizer's own)."""

    def values(self, applied: int) -> tuple[list[float], Betas | None]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


# DeepSpeed's OneCycle writes every group's betas as (momentum, 0.99) whenever it cycles momentum, whatever
# beta2 the optimizer had (runtime/lr_schedules.py, OneCycle._initialize_momentum, 0.19.8)
CYCLE_BETA2 = 0.99


class OneCycle(HostSchedule):
    """DeepSpeed's OneCycle: a triangular lr cycle between cycle_min_lr and cycle_max_lr (and beta1 the other
    way between cycle_max_mom and cycle_min_mom, beta2 then CYCLE_BETA2), then decay."""

    def __init__(self, p: SchedulerParams, group_lrs: list[float], group_beta1: list[float]) -> None:
        self.p, self.groups = p, len(group_lrs)
        self.own_lrs, self.own_beta1 = list(group_lrs), list(group_beta1)
        first = float(p.cycle_first_step_size)
        second = float(p.cycle_second_step_size) if p.cycle_second_step_size is not None else first
        self.first, self.second, self.total = first, second, first + second
        self.ratio = first / self.total
        self.second_stairs = (
            p.cycle_first_stair_count if p.cycle_second_stair_count is None else p.cycle_second_stair_count
        )
        self.skip_decay = math.isclose(p.decay_step_size, 0)

    def _scale(self, it: int) -> float:
        batch = it + 1
        cycle = math.floor(1 + batch / self.total)
        x = 1.0 + batch / self.total - cycle
        if x <= self.ratio:
            scale, stairs = x / self.ratio, self.p.cycle_first_stair_count
        else:
            scale, stairs = (x - 1) / (self.ratio - 1), self.second_stairs
        if stairs > 0:
            pos = batch % self.total
            step = pos * stairs / self.first if pos <= self.first else (self.total - pos) * stairs / self.second
            scale = math.floor(step) / stairs
        return scale

    def values(self, applied: int) -> tuple[list[float], Betas | None]:
        p = self.p
        it = p.last_batch_iteration + applied  # the scheduler's last_batch_iteration for this update
        if applied == 0:  # what the scheduler wrote at construction (nothing when resuming)
            fresh = p.last_batch_iteration == -1
            lrs = [p.cycle_min_lr] * self.groups if fresh else self.own_lrs
            return lrs, (self._betas(p.cycle_min_mom) if fresh and p.cycle_momentum else None)
        if it < self.total:
            s = self._scale(it)
            lr = p.cycle_min_lr + (p.cycle_max_lr - p.cycle_min_lr) * s
            mom = p.cycle_max_mom - (p.cycle_max_mom - p.cycle_min_mom) * s
        else:
            interval = (it - self.total + 1) / p.decay_step_size if not self.skip_decay else 0.0
            lr = (
                p.cycle_min_lr
                if self.skip_decay or math.isclose(p.decay_lr_rate, 0)
                else (p.cycle_min_lr / (1 + p.decay_lr_rate * interval))
            )
            mom = (
                p.cycle_max_mom
                if self.skip_decay or math.isclose(p.decay_mom_rate, 0)
                else (p.cycle_max_mom * (1 + p.decay_mom_rate * interval))
            )
        return [lr] * self.groups, (self._betas(mom) if p.cycle_momentum else None)

    def _betas(self, momentum: float) -> Betas:
        return [(momentum, CYCLE_BETA2)] * self.groups


class TorchScheduler(HostSchedule):
    """The caller's scheduler (torch's, or deepspeed.runtime.lr_schedules'), stepped once per applied update; its
    optimizer's groups are read."""

    def __init__(self, scheduler: Any, batch_size: int) -> None:
        self.scheduler, self.stepped, self.batch_size = scheduler, 0, batch_size

    def values(self, applied: int) -> tuple[list[float], Betas | None]:
        with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": the engine steps it
            warnings.simplefilter("ignore")
            while self.stepped < applied:
                try:
                    self.scheduler.step()
                except TypeError:  # a step that wants an argument (ReduceLROnPlateau's metric): DeepSpeed's engine
                    self.scheduler.step(self.batch_size)  # passes its global batch size, and so does this one
                self.stepped += 1
        groups = self.scheduler.optimizer.param_groups
        return [float(g["lr"]) for g in groups], _group_betas(groups)

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict(), "stepped": self.stepped}

    def stay(self, moved: int, lrs: Any, betas: Any = None) -> None:
        """A load that took the optimizer's states but not this scheduler's, as DeepSpeed's: the scheduler stays
        where it was while the applied count moves by `moved`, and its optimizer's groups take the lrs (and betas)
        the loaded optimizer's groups held, where the checkpoint has them; its next step starts from those."""
        self.stepped += moved
        groups = self.scheduler.optimizer.param_groups
        if isinstance(lrs, list) and len(lrs) == len(groups) and all(is_lr(lr) for lr in lrs):
            for group, lr in zip(groups, lrs):
                group["lr"] = float(lr)
        pairs = checked_betas(betas, len(groups))
        for group, pair in zip(groups, pairs or ()):
            if "betas" in group:
                group["betas"] = pair

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's plain-data state, checked against this scheduler's own keys before it is applied."""
        own = self.scheduler.state_dict()
        saved = state.get("scheduler") if isinstance(state, dict) else None
        stepped = state.get("stepped") if isinstance(state, dict) else None
        if (
            not isinstance(saved, dict)
            or set(saved) - set(own)
            or not _plain(saved)
            or isinstance(stepped, bool)
            or not isinstance(stepped, int)
            or stepped < 0
        ):
            raise ValueError(f"the saved lr scheduler state does not fit this {type(self.scheduler).__name__}")
        self.scheduler.load_state_dict(saved)
        self.stepped = stepped
        # a torch scheduler's state holds the lrs it last set, but loading it leaves its optimizer's groups alone
        last = saved.get("_last_lr")
        groups = self.scheduler.optimizer.param_groups
        if (
            isinstance(last, list)
            and len(last) == len(groups)
            and all(isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) for lr in last)
        ):
            for group, lr in zip(groups, last):
                group["lr"] = lr


def _plain(value: Any, depth: int = 0) -> bool:
    """JSON-like data only (what a checkpoint may hand to a scheduler's load_state_dict)."""
    if depth > 8:
        return False
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, list):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _group_betas(groups: list[dict]) -> Betas | None:
    """Each group's (beta1, beta2) as its optimizer would step with them (a scheduler may have moved both)."""
    if not all("betas" in g for g in groups):
        return None
    return [(float(g["betas"][0]), float(g["betas"][1])) for g in groups]


def checked_betas(betas: Any, groups: int) -> list[tuple[float, float]] | None:
    """`betas` as one (beta1, beta2) in [0, 1) per group, or None where it is not that (a checkpoint's saved groups:
    the schedule's betas are used instead)."""
    if not isinstance(betas, (list, tuple)) or len(betas) != groups:
        return None
    pairs = [tuple(b) if isinstance(b, (list, tuple)) and len(b) == 2 else () for b in betas]
    ok = all(len(p) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1
                                 for x in p) for p in pairs)
    return [(float(p[0]), float(p[1])) for p in pairs] if ok else None


def is_lr(value: Any) -> bool:
    """A finite number >= 0 (a bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


class StepFunction(HostSchedule):
    """`fn(step) -> lr` for every group, `step` counting the updates applied before this one."""

    def __init__(self, fn: Callable[[int], float], groups: int) -> None:
        self.fn, self.groups = fn, groups

    def values(self, applied: int) -> tuple[list[float], Betas | None]:
        lr = self.fn(applied)
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        if not is_lr(lr):
            raise ValueError(f"lr_scheduler({applied}) returned {lr!r}; it must return a finite lr >= 0")
        return [float(lr)] * self.groups, None


class GroupLrs(HostSchedule):
    """The lrs (and betas) a training loop writes into the optimizer's groups itself, with no scheduler
    (`for g in optimizer.param_groups: g["lr"] = lr`), read at each update as DeepSpeed's optimizer reads them."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def values(self, applied: int) -> tuple[list[float], Betas | None]:
        groups = self.optimizer.param_groups
        bad = next((i for i, g in enumerate(groups) if not is_lr(g["lr"])), None)
        if bad is not None:
            raise ValueError(f"optimizer.param_groups[{bad}]['lr'] is {groups[bad]['lr']!r}; set a finite lr >= 0")
        return [float(g["lr"]) for g in groups], _group_betas(groups)


class AtPosition(HostSchedule):
    """The config's host schedule (OneCycle) at its scheduler's position: the applied updates plus the steps the
    script took on the scheduler itself (optim/facade.EngineScheduler)."""

    def __init__(self, schedule: HostSchedule, handle: Any) -> None:
        self.schedule, self.handle = schedule, handle

    def values(self, applied: int) -> tuple[list[float], Betas | None]:
        own = self.schedule.values(applied + self.handle.extra)
        held = self.handle.held_values(applied)  # what a checkpoint load left in the groups, for its next update
        return own if held is None else (held[0], held[1] if held[1] is not None else own[1])


class LrWrites:
    """Watches a run without any scheduler: until its loop writes a group's lr, the config's lr holds (on the
    device, and host updates may start during backward); `written()` says when it has."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer, self.initial = optimizer, [g["lr"] for g in optimizer.param_groups]

    def written(self) -> bool:
        return any(g["lr"] != lr for g, lr in zip(self.optimizer.param_groups, self.initial))


def make_schedules(
    cfg: Any, plan: Any, lr_scheduler: Any, optimizer: torch.optim.Optimizer, engine: Any
) -> tuple[HostSchedule | None, Any]:
    """(the host schedule the engine evaluates, if any; the scheduler object handed back to the caller)."""
    from .config_errors import ConfigError
    from .config_host_schedules import config_host_schedule
    from .optim.facade import EngineScheduler

    assert lr_scheduler is None or cfg.scheduler is None, "the engine drops the config's scheduler for a passed one"
    if lr_scheduler is None:
        if cfg.scheduler is None:
            return None, None
        handle = EngineScheduler(engine, cfg.scheduler.params.last_batch_iteration)
        own = config_host_schedule(cfg.scheduler, [g.lr for g in plan.groups], [g.betas[0] for g in plan.groups])
        return (None if own is None else AtPosition(own, handle)), handle
    made = lr_scheduler
    if not _is_scheduler(made) and callable(made):
        try:  # DeepSpeed's form: a callable that builds a scheduler on the optimizer
            made = lr_scheduler(optimizer)
        except Exception:
            made = None
        if not _is_scheduler(made):
            return StepFunction(lr_scheduler, len(plan.groups)), None
    if not _is_scheduler(made):
        raise ConfigError(
            f"lr_scheduler must be a torch LRScheduler, one of deepspeed.runtime.lr_schedules', a callable building "
            f"one from the optimizer, or `lambda step: lr`; got {type(lr_scheduler).__name__}")
    if made.optimizer is not optimizer:
        raise ConfigError("lr_scheduler is bound to another optimizer than the one passed to initialize; build it "
                          "on that optimizer (or pass `lambda opt: Scheduler(opt, ...)`)")
    return TorchScheduler(made, cfg.train_batch_size), made


def _is_scheduler(obj: Any) -> bool:
    """A torch LRScheduler, or one shaped as DeepSpeed's (deepspeed.runtime.lr_schedules): bound to an optimizer,
    stepped, saved and loaded."""
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        return True
    bound = hasattr(getattr(obj, "optimizer", None), "param_groups")
    return bound and all(callable(getattr(obj, name, None)) for name in ("step", "state_dict", "load_state_dict"))

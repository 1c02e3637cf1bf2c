"""The config's schedules that are evaluated on the host (host_schedules.py): OneCycle, and LRRangeTest with
DeepSpeed 0.19.8's formula, which deepspeed.runtime.lr_schedules.LRRangeTest evaluates too:

    lr = min_lr * (1 + step_rate * interval),  interval = (it + 1) / step_size  (floored with staircase)

at the scheduler's last_batch_iteration `it`. As DeepSpeed's scheduler, a fresh one (last_batch_iteration -1)
writes min_lr into the groups at construction, for the first update, and a resumed one writes nothing (the first
update runs at each group's own lr); after each update the engine steps it, so update n runs at it = start + n - 1.
"""

from __future__ import annotations

import math

import torch

from .config_errors import ConfigError
from .config_optimizer_models import SchedulerConfig, SchedulerParams
from .host_schedules import Betas, HostSchedule, OneCycle


def range_test_lrs(min_lrs: list[float], step_size: int, step_rate: float, staircase: bool,
                   iteration: int) -> list[float]:
    """Each group's lr at DeepSpeed's `last_batch_iteration` = `iteration`, in Python floats as DeepSpeed's."""
    interval = float(iteration + 1) / step_size
    increase = 1 + step_rate * (math.floor(interval) if staircase else interval)
    return [lr * increase for lr in min_lrs]


class RangeTest(HostSchedule):
    """DeepSpeed's LRRangeTest from the config's `lr_range_test_*` parameters."""

    def __init__(self, p: SchedulerParams, group_lrs: list[float]) -> None:
        given = p.lr_range_test_min_lr
        if isinstance(given, list) and len(given) != len(group_lrs):
            raise ConfigError(
                f"scheduler.params.lr_range_test_min_lr has {len(given)} values but the optimizer has "
                f"{len(group_lrs)} parameter groups; give one per group, or a single number for all"
            )
        self.min_lrs = list(given) if isinstance(given, list) else [given] * len(group_lrs)
        self.own_lrs, self.p = list(group_lrs), p

    def values(self, applied: int) -> tuple[list[float], Betas | None]:
        p = self.p
        if applied == 0:  # what the scheduler wrote at construction (nothing when resuming)
            return (self.min_lrs if p.last_batch_iteration == -1 else self.own_lrs), None
        it = p.last_batch_iteration + applied
        return range_test_lrs(self.min_lrs, p.lr_range_test_step_size, p.lr_range_test_step_rate,
                              p.lr_range_test_staircase, it), None


class PerGroup(HostSchedule):
    """A section with per-group lists (DeepSpeed's WarmupLR / WarmupDecayLR / OneCycle take one value per param
    group): one schedule per group's values, each group's lr (and betas) taken from its own. WarmupLR and
    WarmupDecayLR are then evaluated on the host, with the device formula in float64 (DeepSpeed's Python floats)."""

    def __init__(self, sections: list[SchedulerConfig], group_lrs: list[float], group_beta1: list[float]) -> None:
        from .lr_schedules import lr_schedule_of

        if sections[0].type == "OneCycle":
            self.each = [OneCycle(s.params, group_lrs, group_beta1).values for s in sections]
        else:
            formulas = [lr_schedule_of(s, group_lrs, torch.float64) for s in sections]
            self.each = [lambda applied, f=f: (f(torch.tensor([float(applied)])).tolist(), None) for f in formulas]

    def values(self, applied: int) -> tuple[list[float], Betas | None]:
        per_section = [values(applied) for values in self.each]
        lrs = [float(lrs[i]) for i, (lrs, _) in enumerate(per_section)]
        betas = None if per_section[0][1] is None else [betas[i] for i, (_, betas) in enumerate(per_section)]
        return lrs, betas


def config_host_schedule(sched: SchedulerConfig, group_lrs: list[float], group_beta1: list[float]
                         ) -> HostSchedule | None:
    """The host schedule of the config's scheduler section (None: a device schedule, lr_schedules.py)."""
    if sched.per_group:
        return PerGroup(sched.for_groups(len(group_lrs)), group_lrs, group_beta1)
    if sched.type == "OneCycle":
        return OneCycle(sched.params, group_lrs, group_beta1)
    if sched.type == "LRRangeTest":
        return RangeTest(sched.params, group_lrs)
    return None

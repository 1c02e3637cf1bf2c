"""`deepspeed.runtime.lr_schedules`: DeepSpeed's schedulers, built on an optimizer by the script itself.

    scheduler = WarmupDecayLR(optimizer, total_num_steps=1000, warmup_max_lr=3e-4, warmup_num_steps=100)
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer,
                                                           lr_scheduler=scheduler, config=...)

Each takes DeepSpeed's arguments (positional in DeepSpeed's order, or by name), checked as the config's
`scheduler` section is, and evaluates the same formulas as the config's schedules (zero_core/lr_schedules.py,
host_schedules.py): `step()` writes the lr of the next update (and OneCycle's betas) into the optimizer's groups,
`state_dict()` is `{"last_batch_iteration": ...}`. Passed to `initialize`, the engine steps it after each applied
update, as DeepSpeed does. LRRangeTest too, with the formula of the config's LRRangeTest (config_host_schedules.py).
`get_last_lr()` before the first `step()` answers as DeepSpeed's: the lrs written at construction where one starts
afresh, else (OneCycle always, any of them resumed at a `last_batch_iteration`) DeepSpeed's AssertionError, which
scripts may catch, as one line.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from pydantic import ValidationError

from ...config_errors import ConfigError, from_validation_error
from ...config_keys import SCHEDULER_ARGUMENTS
from ...config_host_schedules import range_test_lrs
from ...config_optimizer_models import SchedulerConfig
from ...host_schedules import Betas
from ...host_schedules import OneCycle as _HostOneCycle
from ...lr_schedules import lr_schedule_of

WARMUP_LOG_RATE, WARMUP_LINEAR_RATE = "log", "linear"
LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR = "LRRangeTest", "OneCycle", "WarmupLR"
WARMUP_DECAY_LR, WARMUP_COSINE_LR = "WarmupDecayLR", "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]
_REQUIRED = {WARMUP_DECAY_LR: ("total_num_steps",), WARMUP_COSINE_LR: ("total_num_steps",),
             ONE_CYCLE: ("cycle_min_lr", "cycle_max_lr")}
# the arguments DeepSpeed also takes as a list or tuple, one value per param group
_PER_GROUP = {WARMUP_LR: ("warmup_min_lr", "warmup_max_lr"), WARMUP_DECAY_LR: ("warmup_min_lr", "warmup_max_lr"),
              ONE_CYCLE: ("cycle_min_lr", "cycle_max_lr", "cycle_min_mom", "cycle_max_mom")}


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The optimizer, or the torch one a wrapper holds as `.optimizer` (as DeepSpeed accepts)."""
    for candidate in (optimizer, getattr(optimizer, "optimizer", None)):
        if isinstance(candidate, torch.optim.Optimizer):
            return candidate
    raise TypeError(f"{type(optimizer).__name__} is not a torch.optim.Optimizer; build the scheduler on one")


def _not_stepped(kind: str) -> AssertionError:
    # DeepSpeed's exception type (an assert there), raised explicitly so that `python -O` keeps it
    return AssertionError(f"{kind}.get_last_lr(): need to call step() first")


class _Schedule:
    kind = ""
    _cycles_betas = False  # OneCycle's momentum cycling, where the optimizer has betas
    _reports_before_step = True  # get_last_lr() answers the lrs written at a fresh construction (not OneCycle's)

    def __init__(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        self.optimizer = _torch_optimizer(optimizer)
        order = SCHEDULER_ARGUMENTS[self.kind]
        if len(args) > len(order):
            raise TypeError(f"{self.kind}() takes {len(order)} arguments after the optimizer, got {len(args)}")
        given = dict(zip(order, args))
        for name, value in kwargs.items():
            if name not in order:
                raise TypeError(f"{self.kind}() got an unexpected argument '{name}'; its arguments: {', '.join(order)}")
            if name in given:
                raise TypeError(f"{self.kind}() got two values for '{name}'")
            given[name] = value
        missing = [k for k in _REQUIRED.get(self.kind, ()) if given.get(k) is None]
        if missing:
            raise TypeError(f"{self.kind}() needs {' and '.join(missing)}")
        # one checked config per group where a per-group argument is a list, else one for every group
        self.configs = [self._checked(one) for one in self._per_group(given)]
        self.config = self.configs[0]
        self.start = self.last_batch_iteration = self.config.params.last_batch_iteration
        self.own_lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        self._last_lr: list[float] | None = None
        self._prepare()
        self._write()  # the values of the first update (the groups' own lr when resuming)
        if self.start != -1 or not self._reports_before_step:
            self._last_lr = None  # as DeepSpeed's: nothing to report until step()

    def _per_group(self, given: dict[str, Any]) -> list[dict[str, Any]]:
        """`given` once, or once per param group with each list argument's value for that group."""
        lists = {k: v for k, v in given.items() if k in _PER_GROUP.get(self.kind, ()) and isinstance(v, (list, tuple))}
        if not lists:
            return [given]
        groups = len(self.optimizer.param_groups)
        for name, values in lists.items():
            if len(values) != groups:
                raise ValueError(f"{self.kind}: {name} has {len(values)} values but the optimizer has {groups} param "
                                 f"groups; pass one value per group or a single number")
        return [{**given, **{k: v[i] for k, v in lists.items()}} for i in range(groups)]

    def _checked(self, given: dict[str, Any]) -> SchedulerConfig:
        try:
            return SchedulerConfig.model_validate({"type": self.kind, "params": given})
        except ValidationError as err:
            problem = str(from_validation_error(err, SchedulerConfig)).removeprefix("params.")  # an argument here
            raise ConfigError(f"{self.kind}: {problem}") from None

    def _diagonal(self, per_config: list[tuple[list[float], Betas | None]]) -> tuple[list[float], Betas | None]:
        """Group i's values from config i's evaluation (each evaluates every group), or the one config's."""
        if len(per_config) == 1:
            return per_config[0]
        lrs = [values[0][i] for i, values in enumerate(per_config)]
        betas = None if per_config[0][1] is None else [values[1][i] for i, values in enumerate(per_config)]
        return lrs, betas

    def _prepare(self) -> None:
        """Build the formula from the checked arguments and the groups' own lrs."""
        raise NotImplementedError

    def _values(self, updates: int) -> tuple[list[float], Betas | None]:
        """(lr per group, (beta1, beta2) per group or None) after `updates` steps from construction."""
        raise NotImplementedError

    def _write(self) -> None:
        lrs, betas = self._values(self.last_batch_iteration - self.start)
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        if betas is not None and self._cycles_betas:
            for group, pair in zip(self.optimizer.param_groups, betas):
                group["betas"] = pair
        self._last_lr = list(lrs)

    def step(self, last_batch_iteration: int | None = None) -> None:
        """Move to the next iteration (or the one given) and write its lr into the groups."""
        given = last_batch_iteration
        self.last_batch_iteration = self.last_batch_iteration + 1 if given is None else given
        self._write()

    def get_lr(self) -> list[float]:
        return self._values(self.last_batch_iteration - self.start)[0]

    def get_last_lr(self) -> list[float]:
        if self._last_lr is None:
            raise _not_stepped(self.kind)
        return self._last_lr

    def state_dict(self) -> dict[str, int]:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A saved iteration; the groups get its lr (a resumed optimizer's groups may hold another)."""
        self.last_batch_iteration = saved_iteration(self.kind, state)
        self._write()


class _DeviceFormula(_Schedule):
    """WarmupLR, WarmupDecayLR, WarmupCosineLR: the config's device formulas, evaluated on the host."""

    def _prepare(self) -> None:
        self._lr_at = [lr_schedule_of(c, self.own_lrs, torch.float64) for c in self.configs]  # floats, as DeepSpeed

    def _values(self, updates: int) -> tuple[list[float], Betas | None]:
        at = torch.tensor(float(max(updates, 0)))
        return self._diagonal([(lr_at(at).tolist(), None) for lr_at in self._lr_at])


class WarmupLR(_DeviceFormula):
    kind = WARMUP_LR


class WarmupDecayLR(_DeviceFormula):
    kind = WARMUP_DECAY_LR


class WarmupCosineLR(_DeviceFormula):
    kind = WARMUP_COSINE_LR

    def get_lr_ratio(self) -> float:
        """The factor each group's own lr is multiplied by at this iteration (0.0 before the first), as DeepSpeed's."""
        if self.last_batch_iteration < 0:
            return 0.0
        ratio_at = lr_schedule_of(self.config, [1.0], torch.float64)  # the schedule of a group whose lr is 1
        return ratio_at(torch.tensor(float(max(self.last_batch_iteration - self.start, 0)))).item()


class OneCycle(_Schedule):
    kind = ONE_CYCLE
    _reports_before_step = False

    def _prepare(self) -> None:
        own_beta1 = [g["betas"][0] if "betas" in g else g.get("momentum", 0.0) for g in self.optimizer.param_groups]
        self._hosts = [_HostOneCycle(c.params, self.own_lrs, own_beta1) for c in self.configs]
        # DeepSpeed cycles momentum only for an optimizer with betas: SGD's momentum is left alone, with a warning
        self._cycles_betas = self.config.params.cycle_momentum and "betas" in self.optimizer.defaults
        if self.config.params.cycle_momentum and not self._cycles_betas:
            warnings.warn(f"OneCycle: {type(self.optimizer).__name__} has no betas, so its momentum is not cycled (as "
                          "in DeepSpeed); pass cycle_momentum=False to silence this", stacklevel=3)

    def _values(self, updates: int) -> tuple[list[float], Betas | None]:
        return self._diagonal([host.values(max(updates, 0)) for host in self._hosts])


class LRRangeTest:
    """DeepSpeed's learning-rate range test, built on the script's optimizer: the lr grows from
    `lr_range_test_min_lr` (one per group, or one for all) by `lr_range_test_step_rate` times the iterations over
    `lr_range_test_step_size` (whole intervals with `lr_range_test_staircase`), as DeepSpeed's class computes it:
    min_lr * (1 + step_rate * (last_batch_iteration + 1) / step_size) (config_host_schedules.range_test_lrs, which
    the config's `scheduler` section of type LRRangeTest evaluates too)."""

    def __init__(self, optimizer: Any, lr_range_test_min_lr: Any = 1e-3, lr_range_test_step_size: int = 2000,
                 lr_range_test_step_rate: float = 1.0, lr_range_test_staircase: bool = False,
                 last_batch_iteration: int = -1) -> None:
        self.optimizer = _torch_optimizer(optimizer)
        groups = self.optimizer.param_groups
        if isinstance(lr_range_test_min_lr, (list, tuple)):
            if len(lr_range_test_min_lr) != len(groups):
                raise ValueError(f"LRRangeTest: expected {len(groups)} lr_range_test_min_lr (one per group), got "
                                 f"{len(lr_range_test_min_lr)}; pass one per group or a single number")
            self.min_lr = [float(x) for x in lr_range_test_min_lr]
        else:
            self.min_lr = [float(lr_range_test_min_lr)] * len(groups)
        if isinstance(lr_range_test_step_size, bool) or not isinstance(lr_range_test_step_size, int) or \
                lr_range_test_step_size <= 0:
            raise ValueError(f"LRRangeTest: lr_range_test_step_size must be a positive integer, got "
                             f"{lr_range_test_step_size!r}; pass the number of iterations per interval")
        self.step_size, self.step_rate = lr_range_test_step_size, float(lr_range_test_step_rate)
        self.staircase, self.last_batch_iteration = bool(lr_range_test_staircase), last_batch_iteration
        self._last_lr: list[float] | None = None
        if last_batch_iteration == -1:  # as DeepSpeed's: the groups start at min_lr
            self._last_lr = self._write(self.min_lr)

    def _write(self, lrs: list[float]) -> list[float]:
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        return list(lrs)

    def get_lr(self) -> list[float]:
        return range_test_lrs(self.min_lr, self.step_size, self.step_rate, self.staircase, self.last_batch_iteration)

    def get_last_lr(self) -> list[float]:
        if self._last_lr is None:
            raise _not_stepped("LRRangeTest")
        return self._last_lr

    def step(self, batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = self.last_batch_iteration + 1 if batch_iteration is None else batch_iteration
        self._last_lr = self._write(self.get_lr())

    def state_dict(self) -> dict[str, int]:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The saved iteration; as DeepSpeed's, the groups keep their lr until the next step()."""
        self.last_batch_iteration = saved_iteration("LRRangeTest", state)


def saved_iteration(kind: str, state: Any) -> int:
    """A scheduler state_dict's `last_batch_iteration`, checked: plain data from a checkpoint."""
    it = state.get("last_batch_iteration") if isinstance(state, dict) else None
    if isinstance(it, bool) or not isinstance(it, int) or it < -1:
        raise ValueError(f"{kind}.load_state_dict: last_batch_iteration must be an integer >= -1, got {it!r}")
    return it

"""How Accelerate's DeepSpeed path steps the scheduler a script passes to `prepare`, on zero_core's engine.

- One of `deepspeed.runtime.lr_schedules` (found by its class name, as Accelerate does) goes to the engine, which
  steps it once per update; the script's `scheduler.step()` does nothing (DeepSpeedSchedulerWrapper).
- Any other torch scheduler stays outside DeepSpeed, in an AcceleratedScheduler: at each update it is stepped once
  per process (the dataloader's batch counts one process's samples), or once with `split_batches`. Here the
  engine steps it at the update through `PerProcessSteps`, so zbench checkpoints keep its position.
- With `Accelerator(step_scheduler_with_optimizer=False)` that AcceleratedScheduler steps it once at each
  `scheduler.step()` of the script, update or not. Here the script's call steps it (`StepsWhenCalled`) and the engine
  holds it through `ScriptSteps`, which never steps it: each update reads the lr the scheduler last set in the
  optimizer's groups, and zbench checkpoints keep its position. DeepSpeed's schedulers ignore the flag.
- A scheduler stepped on a metric (ReduceLROnPlateau) is held the same way (`OnMetricSteps`); without the flag the
  script's `step(metric)` steps it as AcceleratedScheduler does: once per process after an update, else not at all.
"""

from __future__ import annotations

from typing import Any

import torch

from .handles import EngineSchedule

DEEPSPEED_SCHEDULES = ("LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR")


def is_deepspeed_schedule(obj: Any) -> bool:
    """One of deepspeed.runtime.lr_schedules' schedulers (VALID_LR_SCHEDULES), by class name."""
    return type(obj).__name__ in DEEPSPEED_SCHEDULES


def steps_on_a_metric(obj: Any) -> bool:
    """A scheduler whose `step()` takes a metric: torch's ReduceLROnPlateau, or transformers' GreedyLR (by name,
    as transformers need not be installed)."""
    return isinstance(obj, torch.optim.lr_scheduler.ReduceLROnPlateau) or type(obj).__name__ == "GreedyLR"


class PerProcessSteps:
    """A torch scheduler stepped `steps` times per update, as AcceleratedScheduler.step() does at a sync."""

    def __init__(self, scheduler: Any, steps: int) -> None:
        self.scheduler, self.steps = scheduler, steps
        self.optimizer = scheduler.optimizer

    def step(self) -> None:
        for _ in range(self.steps):
            total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR: never past its last step
            if total is None or self.scheduler._step_count <= total:
                self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()


class ScriptSteps(PerProcessSteps):
    """A torch scheduler the script steps itself: the engine's step of it does nothing, its state is saved."""

    def __init__(self, scheduler: Any) -> None:
        super().__init__(scheduler, 0)

    def step(self) -> None:
        """Nothing: `step_scheduler_with_optimizer=False` leaves each step to the script's `scheduler.step()`."""


class OnMetricSteps(ScriptSteps):
    """A scheduler stepped on a metric while schedulers step with the optimizer: the engine never steps it (its
    `step()` wants the metric); the script's `step(metric)` steps it `steps` times (StepsAfterUpdates)."""

    def __init__(self, scheduler: Any, steps: int) -> None:
        super().__init__(scheduler)
        self.steps = steps


class PreparedSchedule(EngineSchedule):
    """What `prepare` hands back for a scheduler object the engine steps: `step()` does nothing, the rest is the
    scheduler's."""

    def __init__(self, engine: Any, optimizer: Any, scheduler: Any) -> None:
        super().__init__(engine, optimizer)
        self.scheduler = scheduler

    def get_last_lr(self) -> list[float]:
        return list(self.scheduler.get_last_lr())


class StepsWhenCalled(PreparedSchedule):
    """What `prepare` hands back for a torch scheduler under `step_scheduler_with_optimizer=False`: each `step()`
    steps it once, as AcceleratedScheduler then does whatever the gradients' sync."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        self.scheduler.scheduler.step(*args, **kwargs)


class StepsAfterUpdates(PreparedSchedule):
    """What `prepare` hands back for an `OnMetricSteps`: the script's `step(metric)` steps it as AcceleratedScheduler
    does, once per process (once with `split_batches`) where the gradients were just synchronised (an update ran),
    and not at all elsewhere."""

    def __init__(self, engine: Any, optimizer: Any, scheduler: OnMetricSteps, gradient_state: Any) -> None:
        super().__init__(engine, optimizer, scheduler)
        self.gradient_state = gradient_state

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self.gradient_state.sync_gradients:
            for _ in range(self.scheduler.steps):
                self.scheduler.scheduler.step(*args, **kwargs)


def engine_scheduler(scheduler: Any, processes: int, split_batches: bool, with_optimizer: bool = True) -> Any:
    """What the engine is given for the script's scheduler (None, a callable, or a scheduler object)."""
    if scheduler is None or is_deepspeed_schedule(scheduler) or callable(scheduler):
        return scheduler
    if not with_optimizer:
        return ScriptSteps(scheduler)
    steps = 1 if split_batches else processes
    return OnMetricSteps(scheduler, steps) if steps_on_a_metric(scheduler) else PerProcessSteps(scheduler, steps)


def prepared_schedule(engine: Any, optimizer: Any, dummy: bool, gradient_state: Any = None) -> EngineSchedule:
    """The scheduler `prepare` hands back for the script's (`dummy`: a DummyScheduler, the engine's own schedule);
    the script's `step()` steps it only for a `ScriptSteps` (an `OnMetricSteps` after updates)."""
    given = None if dummy else engine.lr_scheduler
    if given is None:
        return EngineSchedule(engine, optimizer)
    if isinstance(given, OnMetricSteps):
        return StepsAfterUpdates(engine, optimizer, given, gradient_state)
    return (StepsWhenCalled if isinstance(given, ScriptSteps) else PreparedSchedule)(engine, optimizer, given)

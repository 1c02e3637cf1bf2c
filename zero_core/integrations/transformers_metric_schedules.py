"""Trainer's schedulers that step on a metric (`lr_scheduler_type="reduce_lr_on_plateau"` or `"greedy"`) on zero_core's
engine, stepped where Trainer with DeepSpeed steps them.

- Over Trainer's own optimizer (the DeepSpeed config has no `optimizer` section), Trainer keeps the scheduler and
  steps it after each evaluation with `metric_for_best_model`: the engine holds it without stepping it
  (`ScriptSteps`), reads the lr it writes into the optimizer's groups at each update, and saves its state.
- Over the config's optimizer, transformers hands the scheduler to DeepSpeed, whose engine steps it after each
  update; `step()` without a metric raises a TypeError there, and DeepSpeed 0.19.8 then calls `step(train batch
  size)` (`DeepSpeedEngine._take_model_step`), so the metric is the batch size, never the evaluation's, and
  Trainer does not step it: `StepsOnBatchSize` does the same.
"""

from __future__ import annotations

from typing import Any

from .accelerate_schedules import PerProcessSteps, ScriptSteps, steps_on_a_metric


class StepsOnBatchSize(PerProcessSteps):
    """A metric scheduler the engine steps once per update with the global batch size as its metric."""

    def __init__(self, scheduler: Any, train_batch_size: int) -> None:
        super().__init__(scheduler, 1)
        self.train_batch_size = train_batch_size

    def step(self) -> None:
        self.scheduler.step(self.train_batch_size)


def held_by_engine(scheduler: Any, config_optimizer: bool, train_batch_size: int) -> Any:
    """What the engine is given for Trainer's `scheduler`: itself, or a holder for a metric scheduler."""
    if not steps_on_a_metric(scheduler):
        return scheduler
    return StepsOnBatchSize(scheduler, train_batch_size) if config_optimizer else ScriptSteps(scheduler)

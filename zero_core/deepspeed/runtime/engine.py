"""`deepspeed.runtime.engine.DeepSpeedEngine`: what `initialize` returns, for scripts that check for it; and the
types of the optimizer and scheduler factories `initialize` takes (`optimizer=lambda params: ...`)."""

from typing import Callable, Iterable, Union

from torch.nn import Parameter
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from ...engine import Engine as DeepSpeedEngine

DeepSpeedOptimizerCallable = Callable[[Union[Iterable[Parameter], dict[str, Iterable]]], Optimizer]
DeepSpeedSchedulerCallable = Callable[[Optimizer], LRScheduler]

__all__ = ["DeepSpeedEngine", "DeepSpeedOptimizerCallable", "DeepSpeedSchedulerCallable"]

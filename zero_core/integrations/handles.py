"""What a framework's training loop holds as its optimizer and scheduler when zero_core's engine trains.

Frameworks built for DeepSpeed call `optimizer.step()`, `scheduler.step()` and `optimizer.zero_grad()` after the
backward; as with DeepSpeed, the engine has already applied the update by then (at the backward that ends the
window), so these do nothing. They answer what loops and callbacks read: the groups, and the lr as the scheduler
Trainer would hold with DeepSpeed reports it. That depends on who steps it there: a schedule DeepSpeed steps (the
config's "scheduler", or Trainer's built on the config's "optimizer") has moved on by the time Trainer logs, so it
shows the next update's lr; Trainer's own scheduler over its own optimizer is not given to DeepSpeed, Trainer steps
it after logging, so it shows the lr of the update just applied until that `step()`.
"""

from __future__ import annotations

from typing import Any

import torch


class EngineOptimizer:
    """The engine's groups behind the usual optimizer calls; `step()` is the engine's, done at the backward."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.engine.client_optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        return self.engine.client_optimizer.defaults

    @property
    def state(self) -> Any:
        return self.engine.client_optimizer.state

    def step(self, closure: Any = None) -> None:
        """Nothing: the engine applied the update at the accumulation boundary's backward."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: the engine frees each gradient once it is reduced."""

    def state_dict(self) -> dict[str, Any]:
        return {}  # the optimizer states live in zbench checkpoints (engine.save_checkpoint)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing: engine.load_checkpoint restores the optimizer states."""

    def train(self) -> None:
        """Schedule-free optimizers' hook; nothing to do."""

    def eval(self) -> None:
        """Schedule-free optimizers' hook; nothing to do."""


class EngineSchedule:
    """The engine's schedule (the config's, or the scheduler it was given, which the engine steps itself).

    `stepped_by_loop`: Trainer steps this schedule after reading it, as it steps its own scheduler with DeepSpeed;
    the lrs shown then move on at that `step()`, not at the engine's update."""

    def __init__(self, engine: Any, optimizer: EngineOptimizer, stepped_by_loop: bool = False) -> None:
        self.engine, self.optimizer = engine, optimizer
        self.stepped_by_loop = stepped_by_loop
        self.shown: list[float] | None = None  # with stepped_by_loop: the lrs until the loop's next step()
        self.restart()

    def restart(self) -> None:
        """Show the next update's lrs from here on (built, or a checkpoint loaded): no update since applied them."""
        if self.stepped_by_loop:
            self.shown = self.engine.get_lr()

    def step(self, *args: Any, **kwargs: Any) -> None:
        """The engine already stepped its schedule after the update; a loop-stepped one now shows the next lrs
        (the same where the engine skipped the update: its schedule did not move)."""
        self.restart()

    def get_last_lr(self) -> list[float]:
        """A loop-stepped schedule's lrs as of its last step(); else the next update's, as a scheduler DeepSpeed
        steps reports them (a host sync)."""
        if self.shown is not None:
            return list(self.shown)
        return self.engine.get_lr()

    def state_dict(self) -> dict[str, Any]:
        return {}  # zbench checkpoints hold the schedule's position

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing: engine.load_checkpoint restores the schedule."""


def hidden_size(model: torch.nn.Module) -> int | None:
    """The model's hidden size as Trainer reads it for the "auto" bucket sizes (None: the model has no HF config)."""
    config = getattr(model, "config", None)
    for holder in (config, getattr(config, "text_config", None)):
        if getattr(holder, "hidden_size", None) is not None:
            return int(holder.hidden_size)
        if getattr(holder, "hidden_sizes", None):
            return int(max(holder.hidden_sizes))
    return None

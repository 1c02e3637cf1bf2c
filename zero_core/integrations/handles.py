"""What a framework's training loop holds as its optimizer and scheduler when zero_core's engine trains.

Frameworks built for DeepSpeed call `optimizer.step()`, `scheduler.step()` and `optimizer.zero_grad()` after the
backward; as with DeepSpeed, the engine has already applied the update by then (at the backward that ends the
window), so these do nothing. They answer what loops and callbacks read: the groups, and the lr as the scheduler
Trainer would hold with DeepSpeed reports it. That depends on who steps it there: a schedule DeepSpeed steps (the
config's "scheduler", or Trainer's built on the config's "optimizer") has moved on by the time Trainer logs, so it
shows the next update's lr; Trainer's own scheduler over its own optimizer is not given to DeepSpeed, Trainer steps
it after logging, so it shows the lr of the update just applied until that `step()`. Both save and load their
states as DeepSpeed's do behind Accelerate's wrappers (handle_states.py).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from .handle_states import load_optimizer_state, optimizer_state


class EngineOptimizer(torch.optim.Optimizer):
    """The engine's groups behind the usual optimizer calls; `step()` is the engine's, done at the backward.

    A torch Optimizer, as Accelerate's DeepSpeed wrapper is, so that a scheduler built on the prepared optimizer
    (`get_linear_schedule_with_warmup(optimizer, ...)` after `prepare`) is accepted; the lrs it writes into the
    groups are the engine's next ones. torch's __init__ is not run: the groups and states are the engine's."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        for hooks in ("step_pre", "step_post", "state_dict_pre", "state_dict_post", "load_state_dict_pre",
                      "load_state_dict_post"):  # what torch's __init__ sets up for its hook registries
            setattr(self, f"_optimizer_{hooks}_hooks", OrderedDict())

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.engine.client_optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.engine.client_optimizer.defaults

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.engine.client_optimizer.state

    def step(self, closure: Any = None) -> None:
        """Nothing: the engine applied the update at the accumulation boundary's backward."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: the engine frees each gradient once it is reduced."""

    def state_dict(self) -> dict[str, Any]:
        """This rank's optimizer states, as DeepSpeed's ZeRO optimizer gives them (handle_states.py)."""
        return optimizer_state(self.engine, self.param_groups)

    def load_state_dict(self, state: Any) -> None:
        """What `state_dict()` gave on this same partition, or DeepSpeed's list of every rank's (handle_states.py)."""
        load_optimizer_state(self.engine, self.param_groups, state)

    def train(self) -> None:
        """Schedule-free optimizers' hook; nothing to do."""

    def eval(self) -> None:
        """Schedule-free optimizers' hook; nothing to do."""


class EngineSchedule:
    """The engine's schedule (the config's, or the scheduler it was given, which the engine steps itself).

    `stepped_by_loop`: Trainer steps this schedule after reading it, as it steps its own scheduler with DeepSpeed;
    the lrs shown then move on at that `step()`, not at the engine's update. `loads`: its `load_state_dict` moves
    the schedule (False where a framework hands it back what the engine's checkpoint already restored)."""

    def __init__(self, engine: Any, optimizer: EngineOptimizer, stepped_by_loop: bool = False,
                 loads: bool = True) -> None:
        self.engine, self.optimizer = engine, optimizer
        self.stepped_by_loop, self.loads = stepped_by_loop, loads
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
        """The state of the scheduler the engine steps, as Accelerate's wrapper returns its scheduler's: a torch
        scheduler's own, DeepSpeed's `{"last_batch_iteration": n}` for the config's schedule ({} without one)."""
        held = self.engine.lr_scheduler
        return held.state_dict() if held is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Back to a position `state_dict()` gave; the next update takes the lr from there. An empty state (what
        this handle gave before it answered its scheduler's) moves nothing."""
        held = self.engine.lr_scheduler
        if held is not None and state and self.loads:
            held.load_state_dict(state)
        self.restart()


def hidden_size(model: torch.nn.Module) -> int | None:
    """The model's hidden size as Trainer reads it for the "auto" bucket sizes (None: the model has no HF config)."""
    config = getattr(model, "config", None)
    for holder in (config, getattr(config, "text_config", None)):
        if getattr(holder, "hidden_size", None) is not None:
            return int(holder.hidden_size)
        if getattr(holder, "hidden_sizes", None):
            return int(max(holder.hidden_sizes))
    return None

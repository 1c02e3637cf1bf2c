"""What a framework's training loop holds as its optimizer and scheduler when zero_core's engine trains.

Frameworks built for DeepSpeed call `optimizer.step()`, `scheduler.step()` and `optimizer.zero_grad()`
after the backward; as with DeepSpeed, the engine has already applied the update by then (`backward_and_step`),
so these do nothing. They answer what loops and callbacks read: the groups, and, as a stepped torch scheduler
reports it, the lr of the next update (what Trainer logs after each step with DeepSpeed).
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
    """The engine's schedule (the config's, or the scheduler it was given, which the engine steps itself)."""

    def __init__(self, engine: Any, optimizer: EngineOptimizer) -> None:
        self.engine, self.optimizer = engine, optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine steps its schedule after every applied update."""

    def get_last_lr(self) -> list[float]:
        """The lrs of the next update, as a torch scheduler reports them after its step() (a host sync)."""
        return self.engine.get_lr()

    def state_dict(self) -> dict[str, Any]:
        return {}  # zbench checkpoints hold the schedule's position

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing: engine.load_checkpoint restores the schedule."""


def backward_and_step(engine: Any, loss: torch.Tensor, scale_wrt_gas: bool = True) -> None:
    """One micro-step: the engine's backward, then its step (an update at the accumulation boundary)."""
    engine.backward(loss, scale_wrt_gas=scale_wrt_gas)
    engine.step()


def hidden_size(model: torch.nn.Module) -> int | None:
    """The model's hidden size as Trainer reads it for the "auto" bucket sizes (None: the model has no HF config)."""
    config = getattr(model, "config", None)
    for holder in (config, getattr(config, "text_config", None)):
        if getattr(holder, "hidden_size", None) is not None:
            return int(holder.hidden_size)
        if getattr(holder, "hidden_sizes", None):
            return int(max(holder.hidden_sizes))
    return None

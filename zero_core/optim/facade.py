"""What `initialize` hands back as the optimizer and the scheduler, for code written against torch and
DeepSpeed: they hold the groups and answer the usual calls; the engine does the work.

- `ZeroOptimizer` is a real `torch.optim.Optimizer` over the model's parameters with the groups'
  hyper-parameters, so a torch scheduler can be built on it (`lr_scheduler=lambda opt: LambdaLR(opt, ...)`)
  and readers of `optimizer.param_groups[0]["lr"]` work; `loss_scale` / `cur_scale` read the engine's scale, as
  on DeepSpeed's ZeRO optimizers. `step()` refuses (the engine steps), `zero_grad()` does nothing (the engine
  frees gradients as it reduces them).
- `EngineScheduler` stands for a schedule the engine runs itself (the config's "scheduler" section):
  `get_last_lr()` reads the device (a host sync), `step()` does nothing, as in DeepSpeed, where the
  engine steps its own scheduler.
"""

from __future__ import annotations

from typing import Any

import torch

from ..loss_scaler import ReportsLossScale
from .param_groups import OptimizerPlan


class ZeroOptimizer(ReportsLossScale, torch.optim.Optimizer):
    def __init__(self, plan: OptimizerPlan) -> None:
        groups = [{"params": g.params, "lr": g.lr, "betas": g.betas, "eps": g.eps, "weight_decay": g.weight_decay}
                  for g in plan.groups]
        super().__init__(groups, defaults={"lr": plan.groups[0].lr, "betas": plan.groups[0].betas,
                                           "eps": plan.groups[0].eps, "weight_decay": plan.groups[0].weight_decay})

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        raise RuntimeError("optimizer.step() is the engine's job: call engine.step() after engine.backward(loss)")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: the engine releases each gradient once it is reduced."""


class EngineScheduler:
    """The engine's own schedule, seen as a scheduler object."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def get_last_lr(self) -> list[float]:
        """The lrs of the next update, as a stepped DeepSpeed scheduler reports them (a host sync)."""
        return self._engine.get_lr()

    get_lr = get_last_lr

    def step(self, *args: Any, **kwargs: Any) -> None:
        """The engine steps its schedule after every applied update; nothing to do here."""

    def state_dict(self) -> dict[str, Any]:
        return {"last_batch_iteration": self._engine.applied_steps() - 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The schedule follows the engine's applied-update count, which checkpoints restore."""

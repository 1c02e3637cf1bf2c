"""One optimizer step of a script written against DeepSpeed's engine API, shared by the scripts that run under
real DeepSpeed (for fixtures) and under zero_core.deepspeed (in tests)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def step_with_mean_loss(engine: Any, loss: torch.Tensor, world: int) -> float:
    """engine.backward(loss) and engine.step(); returns the loss averaged over the ranks."""
    engine.backward(loss)
    engine.step()
    total = loss.detach().clone()
    if world > 1:
        dist.all_reduce(total)
    return float(total) / world

"""`state_dict()` / `load_state_dict()` of the optimizer handle a framework holds (handles.EngineOptimizer), as
DeepSpeed's ZeRO optimizer answers them behind Accelerate's or Trainer's wrapper: this rank's states, and a load of
them (DeepSpeed's form too: a list of every rank's, indexed by rank) that brings back the optimizer's states and
step count while the lr schedule stays where it is, for the scheduler's own `load_state_dict` to place.

Adam runs on the engine's partition: the dict is optim/partition_state.py's (fp32 master, moments, counts, loss
scale, groups' values), loadable on the same stage, world size and rank; a torch optimizer the engine runs on its
shards (SGD, ...) gives and takes its own.
"""

from __future__ import annotations

from typing import Any

from ..host_schedules import TorchScheduler
from ..optim.client_optimizer import ClientOptimizer
from ..optim.facade import EngineScheduler
from ..optim.partition_state import load_partition_state_dict, partition_state_dict


def optimizer_state(engine: Any, groups: list[dict]) -> dict[str, Any]:
    if isinstance(engine.optimizer, ClientOptimizer):
        return engine.client_optimizer.state_dict()
    return partition_state_dict(engine, groups)


def load_optimizer_state(engine: Any, groups: list[dict], state: Any) -> None:
    if isinstance(state, (list, tuple)):  # DeepSpeed's ZeRO optimizers take every rank's, indexed by rank
        if len(state) != engine.world_size:
            raise ValueError(f"optimizer.load_state_dict got a list of {len(state)} states for {engine.world_size} "
                             "ranks; pass every rank's state_dict(), in rank order")
        state = state[engine.rank]
    if isinstance(engine.optimizer, ClientOptimizer):
        engine.client_optimizer.load_state_dict(state)
        return
    before = int(engine.optimizer.applied.item())
    load_partition_state_dict(engine, state, groups)
    moved = int(engine.optimizer.applied.item()) - before
    # the engine counts updates on the host too (applied_steps); it follows its optimizer's loaded count, and the
    # schedule, placed by (or stepped up to) that count, is held where it was: its own load_state_dict moves it, as
    # DeepSpeed's
    engine.steps_not_applied -= moved
    if isinstance(engine.lr_scheduler, EngineScheduler):
        engine.lr_scheduler.extra -= moved
    if isinstance(engine.host_schedule, TorchScheduler):
        engine.host_schedule.stay(moved, None)

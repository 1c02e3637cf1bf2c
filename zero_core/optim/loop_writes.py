"""What a training loop wrote into the optimizer's groups since the config's scheduler last wrote them.

DeepSpeed's scheduler writes each update's lr (and OneCycle's betas) into the optimizer's groups after the step;
a loop that writes `group["lr"]` in between changes the update that follows, and the scheduler's next step
overwrites it again. `GroupWrites` keeps what the groups held when the scheduler wrote them last and says when a
group's lr or betas differ from that, so that the engine can take them for the next update (optim/facade.py).
"""

from __future__ import annotations

from typing import Any

from ..host_schedules import Betas, checked_betas, is_lr
from .group_values import handed_groups


class GroupWrites:
    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer
        self._seen: tuple[list, list] | None = None  # (lrs, betas) as the scheduler left the groups

    def _values(self) -> tuple[list, list]:
        groups = handed_groups(self._optimizer)  # not the property's refresh, which writes them
        return [g.get("lr") for g in groups], [g.get("betas") for g in groups]

    def seen(self) -> None:
        """The groups as they are now are the scheduler's (it has just written them, or overwrites them next)."""
        self._seen = self._values()

    def written(self) -> tuple[list[float], Betas | None] | None:
        """The groups' lrs and betas (None: not every group has a valid pair) where the loop changed any of them
        since `seen()`, else None; an lr that is not a finite number >= 0 is refused in one line."""
        now = self._values()
        if self._seen is None or _same(now, self._seen):
            return None
        lrs, betas = now
        bad = next((i for i, lr in enumerate(lrs) if not is_lr(lr)), None)
        if bad is not None:  # refused at every call until the loop sets a sound lr
            raise ValueError(f"optimizer.param_groups[{bad}]['lr'] is {lrs[bad]!r}; set a finite lr >= 0")
        self._seen = now
        return [float(lr) for lr in lrs], checked_betas(betas, len(betas))


def _same(a: tuple[list, list], b: tuple[list, list]) -> bool:
    """Equal values, by identity first: a group may hold a value `==` cannot compare to a bool (a tensor)."""
    return all(len(x) == len(y) and all(u is v or (type(u) is type(v) and _equal(u, v)) for u, v in zip(x, y))
               for x, y in zip(a, b))


def _equal(u: Any, v: Any) -> bool:
    try:
        return bool(u == v)
    except (RuntimeError, TypeError, ValueError):
        return False

"""The optimizer groups' lrs in a ZeroStrategy checkpoint, for schedules Lightning's loop steps.

A scheduler stepped per epoch, every n steps or on a monitored value is stepped by Lightning, not by the engine;
it writes the lr into the optimizer's groups, and its `load_state_dict` on resume does not write it back. With
DeepSpeedStrategy the loaded optimizer groups carry that lr, so a resumed run goes on at the saved lr: the save
records each group's lr beside Lightning's state, and a fitting resume writes it back.
"""

from __future__ import annotations

import math
from typing import Any

GROUP_LRS = "zero_core_group_lrs"  # the client-state key; taken out again before Lightning sees the state


def restore_group_lrs(groups: list[dict], lrs: Any) -> None:
    """Write the saved lrs into `groups`; a record of another number of groups, or not finite numbers, stays out
    (a run grouped differently: its groups keep their lrs)."""
    if not isinstance(lrs, list) or len(lrs) != len(groups):
        return
    if not all(isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) for lr in lrs):
        return
    for group, lr in zip(groups, lrs):
        group["lr"] = float(lr)

"""The most gloo ranks one machine without GPUs runs: `zbench run` and `zbench train` apply the same rule."""

from __future__ import annotations

import os

CPU_RANKS_PER_CORE = 4  # beyond this the ranks mostly wait for a core, and their collectives time out


def cpu_ranks_problem(ranks: int) -> str | None:
    """The one-line error for `ranks` CPU ranks on this machine (None when they fit)."""
    cores = os.cpu_count() or 1
    if ranks <= cores * CPU_RANKS_PER_CORE:
        return None
    return (f"no GPU here, and {ranks} CPU ranks is more than {CPU_RANKS_PER_CORE} per core on {cores} cores; "
            f"pass --gpus {cores * CPU_RANKS_PER_CORE} or fewer")

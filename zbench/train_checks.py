"""`zbench train`: what would fail on every rank, checked once before any rank starts (one `Error:` line)."""

from __future__ import annotations

from typing import Any

from .cpu_ranks import cpu_ranks_problem


def launch_problem(ds_config: dict[str, Any], nproc: int) -> str | None:
    """The one-line problem with launching `nproc` local ranks of `ds_config` here (None when none is found)."""
    import torch

    if not torch.cuda.device_count():  # NVML-based: does not initialise CUDA in this process
        problem = cpu_ranks_problem(nproc)
        if problem:
            return problem
    return nvme_path_problem(ds_config, nproc)


def nvme_path_problem(ds_config: dict[str, Any], nproc: int) -> str | None:
    """An NVMe offload folder that is missing or not writable (its free space is the ranks' own check: it
    depends on the partition size)."""
    from zero_core.optim.nvme_states import check_path

    zero = ds_config.get("zero_optimization")
    for part in ("optimizer", "param") if isinstance(zero, dict) else ():
        section = zero.get(f"offload_{part}")
        if isinstance(section, dict) and section.get("device") == "nvme" and isinstance(section.get("nvme_path"), str):
            problem = check_path(section["nvme_path"], 0, nproc, f"offload_{part}")
            if problem:
                return problem
    return None

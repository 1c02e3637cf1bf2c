"""`deepspeed.runtime.utils.see_memory_usage(message, force=True)`: the device's allocated and reserved memory
(with their peaks, reset after each report) and the host's used memory, printed by rank 0. Without `force` it
prints nothing, as DeepSpeed's."""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist

from ...meminfo import meminfo_bytes

GiB = 1024**3


def _host_used() -> tuple[float, float]:
    """(GiB used, percent used) of the host's memory: MemTotal - MemAvailable."""
    fields = meminfo_bytes()
    used = fields["MemTotal"] - fields["MemAvailable"]
    return used / GiB, 100 * used / fields["MemTotal"]


def see_memory_usage(message: str, force: bool = False) -> None:
    if not force or (dist.is_initialized() and dist.get_rank() != 0):
        return
    gc.collect()  # what Python has not freed yet would count as used
    print(message, flush=True)
    if torch.cuda.is_available():
        cuda = torch.cuda
        print(f"MA {cuda.memory_allocated() / GiB:.2f} GB Max_MA {cuda.max_memory_allocated() / GiB:.2f} GB "
              f"CA {cuda.memory_reserved() / GiB:.2f} GB Max_CA {cuda.max_memory_reserved() / GiB:.2f} GB", flush=True)
        torch.cuda.reset_peak_memory_stats()
    try:
        used, percent = _host_used()
        print(f"CPU Virtual Memory: used = {used:.2f} GB, percent = {percent:.1f}%", flush=True)
    except KeyError:  # no /proc/meminfo
        print("CPU Virtual Memory: not readable on this host", flush=True)

"""Give each rank on a host its own CPU cores, so the host optimizer steps of neighbouring ranks do not fight.

With optimizer offload every rank runs a multi-threaded Adam on the host at the same moment. Left
alone, two ranks with `cpu_count // 2` threads each are scheduled across all cores, migrate, share
caches and stall each other at every fork/join. Pinned, each rank owns `1 / LOCAL_WORLD_SIZE` of the
physical cores (hyper-thread siblings stay together, cores are split in socket order so a rank's
cores share a socket where the counts allow) and runs that many threads.

`ZERO_CORE_PIN_THREADS`: unset or `auto` pins when the optimizer is offloaded and several ranks share
the host; `1` pins whenever several ranks share the host; `0` never pins (use it when the launcher
already binds ranks: Slurm `--cpu-bind`, numactl, DeepSpeed's `--bind_cores_to_rank`). Pinning never
fails a run: where affinity cannot be read or set, nothing changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from .. import comm
from ..env_switch import env_switch

ENV = "ZERO_CORE_PIN_THREADS"


def _sysfs_core(cpu: int) -> tuple[int, int]:
    """(socket, core) of a logical CPU from sysfs; the CPU itself when the topology is not readable."""
    base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    try:
        return int((base / "physical_package_id").read_text()), int((base / "core_id").read_text())
    except (OSError, ValueError):
        return 0, cpu


def split_cpus(cpus: Iterable[int], local_rank: int, local_world: int,
               core_of: Callable[[int], tuple[int, int]] = _sysfs_core) -> list[int]:
    """This rank's share of `cpus`: whole physical cores in (socket, core) order, split into
    `local_world` contiguous near-equal parts (the first ranks take one more core when it does not
    divide). Disjoint across ranks, and together they cover `cpus`. [] when there are fewer
    physical cores than ranks (no disjoint split exists).
    """
    if not 0 <= local_rank < local_world:
        raise ValueError(f"local rank {local_rank} is outside 0..{local_world - 1}")
    by_core: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(set(cpus)):
        by_core.setdefault(core_of(cpu), []).append(cpu)
    cores = [by_core[k] for k in sorted(by_core)]
    if len(cores) < local_world:
        return []
    base, extra = divmod(len(cores), local_world)
    start = local_rank * base + min(local_rank, extra)
    mine = cores[start : start + base + (1 if local_rank < extra else 0)]
    return sorted(cpu for core in mine for cpu in core)


def _wanted(offload: bool, local_world: int) -> bool:
    switch = env_switch(ENV)
    if switch is False or local_world <= 1:
        return False
    return switch is True or offload


def pin_rank(offload: bool) -> list[int] | None:
    """Pin every thread of this process to its share of the host's cores (`size_team` then sizes torch's
    thread pool to match). Returns the CPUs, or None when not pinned."""
    local_world = comm.local_world_size()
    local_rank = comm.local_rank()
    if not _wanted(offload, local_world) or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        mine = split_cpus(os.sched_getaffinity(0), local_rank % local_world, local_world)
        if not mine:
            return None
        # every existing thread (torch's pool may already run), and new ones inherit from this one
        tasks = [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
        for tid in tasks:
            try:
                os.sched_setaffinity(tid, mine)
            except OSError:  # a thread that just exited, or one we may not move
                pass
        os.sched_setaffinity(0, mine)
    except (OSError, ValueError):
        return None
    return mine


def team_size(cores: int, offload_on_gpu: bool, omp: str = "") -> int:
    """Threads for torch's pool on `cores` cores. With optimizer offload on a GPU the host AdamW runs on its
    own thread while the training thread keeps a core busy (it launches kernels and spin-waits on the
    device); a team as large as the cores then has one thread sharing a core, and each parallel region waits
    for that straggler, so the team leaves the training thread its core (one H100 host, GPT-2 XL: 651 ms
    per host update with 16 threads on 16 cores, 545 ms with 15). A positive OMP_NUM_THREADS wins, within
    `cores`."""
    if omp.strip().isdigit() and int(omp) > 0:
        return min(cores, int(omp))
    return max(1, cores - 1) if offload_on_gpu else cores


_sized: tuple[int, int] | None = None  # (cores, threads) of the last sizing, so a second engine starts from the cores


def size_team(pinned: list[int] | None, offload_on_gpu: bool) -> int:
    """Size torch's thread pool for this rank: its pinned cores, else the pool torch (or the user) chose, not
    the one an earlier engine of this process sized; see `team_size`."""
    global _sized
    current = torch.get_num_threads()
    cores = len(pinned) if pinned else (_sized[0] if _sized and _sized[1] == current else current)
    threads = team_size(cores, offload_on_gpu, os.environ.get("OMP_NUM_THREADS", ""))
    if threads != current:
        torch.set_num_threads(threads)
    _sized = (cores, threads)
    return threads


def describe(cpus: list[int]) -> str:
    """'0-7,16-23' style list."""
    runs: list[str] = []
    start = prev = None
    for c in sorted(cpus):
        if prev is not None and c == prev + 1:
            prev = c
            continue
        if start is not None:
            runs.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = c
    if start is not None:
        runs.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(runs)

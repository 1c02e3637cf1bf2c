"""This rank's process around the training: its device and process group, the GPU memory cap, the scenario's
allocator settings, and what it reports across ranks at the end (loss curve, times, counts, peak memory).

Used by worker.py before the model is built and after the last epoch; nothing here knows about engines.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from zero_core import comm

from .host_memory import peak_rss_bytes


def setup(comm_timeout_s: float | None = None, simulate: int | None = None) -> tuple[torch.device, int, int]:
    """This rank's device and process group; `simulate` = N: rank 0 of N over torch's fake process group
    (no peers: collectives return at once; zero_core keeps its results finite, see zero_core/comm.py)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    threads = os.environ.get("OMP_NUM_THREADS")  # set it when ranks of several "nodes" share one machine
    torch.set_num_threads(int(threads) if threads else max(1, (os.cpu_count() or 1) // comm.local_world_size()))
    timeout = timedelta(seconds=comm_timeout_s) if comm_timeout_s else None  # None: torch's default
    if simulate:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=simulate)
    elif torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return device, dist.get_rank(), dist.get_world_size()


def apply_alloc_conf(conf: str | None) -> None:
    """The scenario's PYTORCH_CUDA_ALLOC_CONF; read when CUDA first allocates, so set before anything does."""
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf


def cap_memory(device: torch.device, cap_gib: float | None) -> None:
    """Pretend the GPU has `cap_gib` (the articles' 24 GB cards on a larger one)."""
    if cap_gib and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * 2**30 / total), device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peaks(device: torch.device) -> tuple[float, float]:
    """(peak GPU GiB, peak CPU RSS GiB), the max over ranks."""
    gpu = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    cpu = peak_rss_bytes() / 2**30
    t = torch.tensor([0.0 if gpu != gpu else gpu, cpu], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return (float(t[0]) if device.type == "cuda" else float("nan")), float(t[1])


def reduce_across_ranks(
    epoch_rows: list[dict[str, Any]], losses: list[torch.Tensor], world: int, simulated: bool, device: torch.device
) -> torch.Tensor:
    """The run's numbers from every rank's: the loss curve averaged over ranks (returned), each epoch's times the
    slowest rank's and its token and row counts summed (written into `epoch_rows`). `simulated`: one process
    stands for every rank, so its own values stand for theirs."""
    curve = torch.stack(losses)
    if not simulated:
        dist.all_reduce(curve)
        curve /= world
    times = torch.tensor(
        [[r["train_s"], r.get("eval_s", 0.0), r.get("steady_s", 0.0)] for r in epoch_rows],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    for r, (t, e, st) in zip(epoch_rows, times.tolist()):
        r["train_s"], r["eval_s"] = t, e
        if "steady_s" in r:
            r["steady_s"] = st
    counts = torch.tensor(
        [[r["tokens"], r.get("steady_tokens", 0), r["rows"]] for r in epoch_rows], dtype=torch.float64, device=device
    )
    if simulated:
        counts *= world  # every rank as many as rank 0
    else:
        dist.all_reduce(counts)  # every rank's positions and rows: the run's
    for r, (n, sn, nr) in zip(epoch_rows, counts.tolist()):
        r["tokens"], r["rows"] = int(n), int(nr)
        if "steady_tokens" in r:
            r["steady_tokens"] = int(sn)
    return curve

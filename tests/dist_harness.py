"""Run a function on N CPU ranks over gloo and collect what rank 0 returns.

Ranks are forked from the tests' fork server (forkserver.py), the test's environment passed along.
`fresh=True` spawns new interpreters instead, for what is read at process start (e.g. glibc's MALLOC_*)."""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import forkserver  # noqa: F401  (what the fork server imports, set before it starts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def _entry(rank: int, world: int, port: int, out: str, env: dict, fn: Callable[..., Any], args: tuple) -> None:
    os.environ.clear()  # the fork server's environment is the one it started with, not this test's
    os.environ.update(env)
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # ZB_TEST_DEVICE=cuda runs the same tests on GPUs over NCCL (one rank per GPU)
    cuda = os.environ.get("ZB_TEST_DEVICE") == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        # bitwise comparisons need run-to-run determinism: cuBLAS with a fixed workspace, and the math
        # attention kernels (the fused ones' backward accumulate with atomics)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        for backend in ("flash", "mem_efficient", "cudnn"):
            getattr(torch.backends.cuda, f"enable_{backend}_sdp")(False)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, fresh: bool = False) -> Any:
    """Start `world` ranks running fn(rank, world, *args); return rank 0's result. On GPUs (ZB_TEST_DEVICE=cuda)
    one rank per GPU: a machine with fewer skips the test."""
    if os.environ.get("ZB_TEST_DEVICE") == "cuda" and torch.cuda.device_count() < world:
        import pytest

        pytest.skip(f"needs {world} GPUs, this machine has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.start_processes(_entry, args=(world, free_port(), out, dict(os.environ), fn, args), nprocs=world,
                           join=True, start_method="spawn" if fresh else "forkserver")
        return torch.load(out, weights_only=False)

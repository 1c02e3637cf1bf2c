"""Run the zbench command line with a fault injected into the rank processes (a helper, not a test module).

    python tests/run_with_faults.py crash|oom zbench-args...

The `zbench run` command forks its CPU ranks, so a patch made here before launching is what the ranks
run: `crash` fails rank 1 of every launch; `oom` raises torch.OutOfMemoryError for batches above 4.
"""

from __future__ import annotations

import sys

import torch

import zbench.worker as worker
from zbench.cli import main

MODE = sys.argv[1]
_real_run = worker._run


def _faulty(job, device, rank, world):
    if MODE == "crash" and rank == 1:
        raise RuntimeError("injected failure on rank 1")
    if MODE == "oom" and job["batch"] > 4:
        raise torch.OutOfMemoryError(f"CUDA out of memory (injected at batch {job['batch']})")
    return _real_run(job, device, rank, world)


worker._run = _faulty
main(sys.argv[2:])

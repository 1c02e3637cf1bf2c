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


if MODE.startswith("crash-at-step-"):  # rank 1 dies once the engine reaches that optimizer step
    import zero_core.engine as engine_module

    _stop = int(MODE.rsplit("-", 1)[1])
    _real_step = engine_module.Engine.step

    def _dying_step(self):
        _real_step(self)
        if self.rank == 1 and self.global_step == _stop:
            raise RuntimeError(f"injected failure on rank 1 at step {_stop}")

    engine_module.Engine.step = _dying_step
else:
    worker._run = _faulty
main(sys.argv[2:])

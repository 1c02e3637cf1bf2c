"""Run the zbench command line with faults injected into the rank processes (a helper, not a test module).

    python tests/run_with_faults.py FAULT[,FAULT...] zbench-args...

The `zbench run` command forks its CPU ranks, so a patch made here before launching is what the ranks
run. Faults:
  crash                 rank 1 of every launch raises at start
  oom                   torch.OutOfMemoryError for batches above 4
  eval-oom              torch.OutOfMemoryError for eval batches above 6 (the eval batch search)
  train-oom             torch.OutOfMemoryError in training (not in probes) for batches above 2
  crash-at-step-N       rank 1 raises once the engine reaches optimizer step N
  hang-at-step-N        rank 1 stops answering (sleeps) just before step N's update
  kill-at-step-N        rank 1 is SIGKILLed in the middle of step N (gradients reduced, weights not yet updated)
  nan-at-step-N         rank 0's loss of step N is NaN (every rank must skip that update)
  disk-free-B           the disk under any NVMe offload path reports B bytes free (zero_core's own space check)
A step fault may end with `:VARIANT` to hit only that variant (e.g. kill-at-step-130:victim).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from types import SimpleNamespace

import torch

import zbench.worker as worker
import zero_core.engine as engine_module
import zero_core.optim.nvme_states as nvme_states
from zbench.cli import main

FAULTS = sys.argv[1].split(",")
_real_run = worker._run
_job: dict = {}


def _faulty(job, device, rank, world):
    _job.update(job)
    if "crash" in FAULTS and rank == 1:
        raise RuntimeError("injected failure on rank 1")
    if "oom" in FAULTS and job["batch"] > 4:
        raise torch.OutOfMemoryError(f"CUDA out of memory (injected at batch {job['batch']})")
    if "train-oom" in FAULTS and job["mode"] == "train" and job["batch"] > 2:
        raise torch.OutOfMemoryError(f"CUDA out of memory (injected in training at batch {job['batch']})")
    if "eval-oom" in FAULTS and (job.get("eval_batch") or 0) > 6:
        raise torch.OutOfMemoryError(f"CUDA out of memory (injected at eval batch {job['eval_batch']})")
    return _real_run(job, device, rank, world)


def _step_faults(kind: str) -> list[tuple[int, str]]:
    """(step, variant or "") of every fault of this kind."""
    out = []
    for fault in FAULTS:
        spec, _, variant = fault.partition(":")
        if spec.startswith(f"{kind}-at-step-"):
            out.append((int(spec.rsplit("-", 1)[1]), variant))
    return out


def _hits(faults: list[tuple[int, str]], step: int) -> bool:
    variant = os.path.basename(os.path.dirname(_job.get("progress", "")))  # logs/<variant>/progress-i.jsonl
    return any(at == step and (not name or name == variant) for at, name in faults)


CRASH, HANG, KILL, NAN = (_step_faults(k) for k in ("crash", "hang", "kill", "nan"))
_real_step, _real_backward = engine_module.Engine.step, engine_module.Engine.backward


def _step(self):
    upcoming = self.global_step + int(self.is_gradient_accumulation_boundary())
    if self.rank == 1 and _hits(KILL, upcoming):
        os.kill(os.getpid(), signal.SIGKILL)  # no exception, no cleanup: the process is simply gone
    if self.rank == 1 and _hits(HANG, upcoming):
        time.sleep(3600)
    _real_step(self)
    if self.rank == 1 and _hits(CRASH, self.global_step):
        raise RuntimeError(f"injected failure on rank 1 at step {self.global_step}")


def _backward(self, loss):
    if self.rank == 0 and _hits(NAN, self.global_step + 1):
        loss = loss * float("nan")
    _real_backward(self, loss)


for fault in FAULTS:  # the NVMe module's view of the disk: only its free space is read
    if fault.startswith("disk-free-"):
        free = int(fault.rsplit("-", 1)[1])
        nvme_states.shutil = SimpleNamespace(disk_usage=lambda path, free=free: shutil._ntuple_diskusage(free, 0, free))

worker._run = _faulty
engine_module.Engine.step = _step
engine_module.Engine.backward = _backward
main(sys.argv[2:])

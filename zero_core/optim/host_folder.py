"""A background thread that folds offloaded gradient shards into the host gradient partition.

With optimizer offload, each reduced shard is copied to pinned host memory on the side stream. Doing
the fp32 accumulation on the autograd thread would stall backward (no new GPU work is queued while it
waits for a copy); on its own thread the host work overlaps with the rest of backward. Torch ops
release the GIL, so the two threads really run in parallel. Jobs run in submission order. Without
gradient accumulation there is nothing to fold (host_adam.py): a job then only marks its copy landed.
"""

from __future__ import annotations

import queue
from typing import Callable

import torch

from .. import worker_threads


class HostFolder:
    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[torch.cuda.Event | None, Callable[[], None]] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = worker_threads.start(self._run, "zero_core-host-folder", stop=lambda: self._jobs.put(None))

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            try:
                if item is None:
                    return
                event, job = item
                if self._error is None:
                    if event is not None:
                        event.synchronize()  # the device-to-host copy has landed
                    job()
            except BaseException as e:  # surfaced on the training thread by wait()
                self._error = e
            finally:
                self._jobs.task_done()

    def submit(self, event: torch.cuda.Event | None, job: Callable[[], None]) -> None:
        """Run `job` once `event` (if any) has completed."""
        self._jobs.put((event, job))

    def wait(self) -> None:
        """Block until every submitted job ran; re-raise the first failure."""
        self._jobs.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"offloaded gradient accumulation failed: {error}") from error

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)


class BackwardEnd:
    """Whether the pass's backward has ended, for the fold thread's speculative updates: queued on the training
    thread (end_pass) and, on CUDA, run by the device. The training thread queues backward far ahead of the
    device, so the updates go on as long as the device's backward hides them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.queued, self._done = False, None

    def mark(self) -> None:
        """Backward is queued (the training thread's end_pass); on CUDA, ended once the device gets here."""
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
            self._done = done
        self.queued = True

    def __call__(self) -> bool:
        if not self.queued:  # read first: mark() sets the event before it
            return False
        done = self._done
        return done is None or done.query()

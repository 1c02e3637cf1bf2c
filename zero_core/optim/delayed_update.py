"""The one-step delayed parameter update of the ZeRO-Offload paper (DPU), opt-in with
`zero_core.offload_delayed_update: true`. It CHANGES THE NUMERICS: the forward and backward of step N+1
run on the weights of update N-1, not N.

At each step the gradient norm, the clip coefficient, the learning rate and the skip decision are taken
as usual, then:
  1. the host update launched by the previous step is joined, and its 16-bit weights are sent to the
     device (and all-gathered) as a plain offloaded step sends them;
  2. this step's update starts on a background thread and runs while the next forward and backward do.

The thread works on a frozen view of the optimizer: this step's gradients (the staging buffer, and the
fp32 accumulation buffer under accumulation, swapped for spares that the next backward fills), counters
and learning rates, and a private 16-bit output (the previous one may still be read by copies in flight).
Masters and moments are updated in place: nothing else touches them while the thread runs. Anything
that reads the states (checkpoints, `full_state_dict`, `close`) first `drain`s the pending update, so a
saved run has every update it computed applied.
"""

from __future__ import annotations

import copy
import threading
from typing import Callable

import torch

from .. import comm, worker_threads
from .base import Output, Publish
from .host_adam import HostAdamW


class DelayedHostAdamW(HostAdamW):
    def __init__(self, states, **kw) -> None:
        super().__init__(states, **kw)
        self._spare_staging = comm.host_buffer(states.numel, self.staging.dtype, pin=self.staging.is_pinned())
        self._spare_grad: torch.Tensor | None = None
        self._private_out: torch.Tensor | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._pending = False  # a finished update whose weights have not been sent yet

    def _update(self, coef: torch.Tensor, out: Output, publish: Publish | None,
                after_segment: Callable[[int], None] | None = None) -> None:
        skip = int(self.overflow[0]) != 0  # a host sync: the copies the last step queued from `out` are done
        self.drain(out, publish)
        if not skip:
            self._launch(float(coef[0]), out)

    def _launch(self, c: float, out: Output) -> None:
        frozen = copy.copy(self)  # shares the states; the buffers the next backward writes are swapped below
        frozen.applied, frozen.lr, frozen.overflow = self.applied.clone(), self.lr.clone(), self.overflow.clone()
        frozen.adam_key = "overlapped_cpu_adam"
        self.staging, self._spare_staging = self._spare_staging, self.staging
        if self.grad is not None:  # accumulation: the next backward's folds go to a spare fp32 buffer
            if self._spare_grad is None:
                self._spare_grad = comm.host_buffer(self.states.numel, torch.float32, pin=False)
            self.grad, self._spare_grad = self._spare_grad, self.grad
        if out is not None and self._private_out is None:
            self._private_out = torch.empty(out.numel(), dtype=out.dtype)
        private, coef = self._private_out, torch.tensor([c])

        def run() -> None:
            try:
                HostAdamW._update(frozen, coef, private, None)
            except BaseException as e:  # surfaced on the training thread by drain()
                self._error = e

        self._pending = True
        self._thread = worker_threads.start(run, "zero_core-delayed-update")

    def run_host_update_with(self, launch: Callable[[Callable[[], None]], None]) -> bool:
        return False  # the update already runs on its own thread, a step late

    @property
    def pending(self) -> bool:
        """An update runs, or ran, whose weights have not been sent yet."""
        return self._pending

    def drain(self, out: Output, publish: Publish | None) -> None:
        """Finish the update in flight and send its weights (into `out`, chunk by chunk through `publish`)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"the delayed optimizer update failed: {error}") from error
        if not self._pending:
            return
        self._pending = False
        if out is None or self._private_out is None:
            return
        n = self.states.numel
        for a in range(0, n, self.chunk):
            b = min(n, a + self.chunk)
            out[a:b].copy_(self._private_out[a:b])
            if publish is not None:
                publish(a, b)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()
        super().close()

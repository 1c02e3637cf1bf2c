"""The streamed chunks' states copied up to the GPU during backward (`zero_core.offload_stream_prefetch`).

In the update window each streamed chunk's fp32 master and moments (12 bytes per element) go up beside the next
forward's weight gathers, and the host-to-device engine is busy most of that window (on one H200 95% of it:
docs/benchmarks/2026-11-27_h100_h200_kept_weights_gpt7b.md). The states do not depend on this pass's gradients:
they are what the last step left. So in the pass that ends at the step, as backward frees its activations, the
first streamed chunks' states are copied up on the streamed update's upload stream, and the step's update starts
on them instead of uploading them again. Backward's own copies are few by then, and the host's memory is idle.

Device memory: a chunk is fetched only while the allocated memory, plus its 12 bytes per element, plus the held
gradients still to come (held_grads.py), stays under the allocated peak seen so far, so it uses memory backward
freed and never raises that peak. Its buffers come from the compute stream's pool, where those activations were.
Anything that reads or replaces the states between backward and the step (a checkpoint, a state read: model_export
.settled) drops what was fetched, and the step uploads those chunks as before. The update is the same kernel on the
same inputs whichever way the states came up: the result is bitwise the same.
"""

from __future__ import annotations

import torch

from .states import NAMES

BYTES_PER_ELEMENT = 12  # fp32 master and both moments
PER_CALL = 4  # chunks fetched per reduced shard at most: spreads the launches over backward's host thread


class StatePrefetch:
    """The first streamed chunks (`ranges`, partition order)' states, fetched to `device` during the final pass."""

    def __init__(self, ranges: list[tuple[int, int]], device: torch.device, up: torch.cuda.Stream | None,
                 enabled: bool) -> None:
        self.ranges, self.device, self.up, self.enabled = ranges, device, up, enabled
        self.cuda = device.type == "cuda"
        self.fetched: dict[int, dict[str, torch.Tensor]] = {}  # chunk start -> its states on the device
        self._next = 0
        self._active = False
        self._compute: torch.cuda.Stream | None = None

    def begin(self, final: bool, ready: bool) -> None:
        """A new backward: fetch in it when it ends at the step and the states can be copied (`ready`: page-locked
        on CUDA, by the first streamed update)."""
        self.drop()
        self._active = self.enabled and final and ready
        self._compute = torch.cuda.current_stream(self.device) if self.cuda and self._active else None

    def drop(self) -> None:
        """Forget what was fetched (the states may change, or the step is skipped); fetch nothing more."""
        self.fetched, self._next, self._active = {}, 0, False

    def more(self, states, to_come: int) -> None:
        """Fetch the next chunks that fit beside `to_come` bytes still to be allocated in this backward."""
        for _ in range(PER_CALL):
            if not self._active or self._next == len(self.ranges):
                return
            a, b = self.ranges[self._next]
            if self.cuda and (torch.cuda.memory_allocated(self.device) + BYTES_PER_ELEMENT * (b - a) + to_come
                              > torch.cuda.max_memory_allocated(self.device)):
                return
            self.fetched[a] = self._fetch(states, a, b)
            self._next += 1

    def _fetch(self, states, a: int, b: int) -> dict[str, torch.Tensor]:
        if not self.cuda:
            return {n: getattr(states, n)[a:b].clone() for n in NAMES}
        assert self._compute is not None and self.up is not None
        with torch.cuda.stream(self._compute):  # the pool backward's freed activations went back to
            bufs = {n: torch.empty(b - a, dtype=torch.float32, device=self.device) for n in NAMES}
        self.up.wait_stream(self._compute)  # the compute stream may still be using that memory
        with torch.cuda.stream(self.up):
            for n, t in bufs.items():
                t.copy_(getattr(states, n)[a:b], non_blocking=True)
                t.record_stream(self.up)  # and the update's streams, once it queues them (streamed_update.py)
        return bufs

    def take(self, a: int) -> dict[str, torch.Tensor] | None:
        """Chunk `a`'s fetched states, given up to the caller (None: upload them as usual)."""
        return self.fetched.pop(a, None)

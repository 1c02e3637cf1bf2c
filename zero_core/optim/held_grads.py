"""The streamed chunks' gradients held where they were reduced, from backward to the update
(`zero_core.offload_stream_hold_grads`).

A streamed chunk (streamed_update.py) is updated on the GPU, so its 16-bit gradient need not go down to host
memory in backward and up again in the step: that is 4 bytes per element through the host, whose memory
traffic sets the offloaded step, and 2 bytes per element on the copy to the host that backward's end waits
for. Held, the chunk's gradient stays on the device in a buffer of its own, filled from the reduced shards as
they arrive (a chunk may straddle two shards) and freed once the update has read it. The memory comes and goes
with backward: held gradients grow as the activations backward frees shrink, and the next forward's activations
grow as the update frees them, so the allocated peak moves little (on one H100 at seed Table 3's shape it did
not move). They come from the reducing stream's pool, though, which the next forward cannot reuse: the reserved
peak grows by about their size. On by default; zero_core.offload_stream_hold_grads: false turns it off.

Only lazy passes hold (the step follows and nothing accumulates: the gradient is the reduced shard times the
pass's scale, rebuilt at the update as the host rebuilds its own). A chunk that did not receive all of its
elements in a pass is written back to staging at the update and read from there, as before.
"""

from __future__ import annotations

import bisect

import torch

from .speculative import without


class HeldGrads:
    """Per streamed chunk (`ranges`, sorted, disjoint), its gradient as received in this pass, on the device."""

    def __init__(self, ranges: list[tuple[int, int]], enabled: bool) -> None:
        self.ranges = ranges
        self._starts = [a for a, _ in ranges]
        self.enabled = bool(ranges) and enabled
        self.active = False  # this pass holds (a lazy pass)
        self._held: dict[int, torch.Tensor] = {}
        self._filled: dict[int, list[tuple[int, int]]] = {}
        self.ready: torch.cuda.Event | None = None  # the last copy into a held buffer, on the reducing stream

    def begin(self, lazy: bool) -> None:
        self.clear()
        self.active = self.enabled and lazy

    def clear(self) -> None:
        self._held, self._filled, self.ready = {}, {}, None

    def take(self, reduced: torch.Tensor, offset: int) -> list[tuple[int, int]]:
        """Hold the streamed parts of the shard [offset, offset + numel); the parts for host staging."""
        end = offset + reduced.numel()
        if not self.active:
            return [(offset, end)]
        i = max(0, bisect.bisect_right(self._starts, offset) - 1)
        touched = []
        for a, b in self.ranges[i:]:
            if a >= end:
                break
            lo, hi = max(a, offset), min(b, end)
            if lo >= hi:
                continue
            touched.append((a, b))
            if a not in self._held:
                self._held[a] = torch.empty(b - a, dtype=reduced.dtype, device=reduced.device)
                self._filled[a] = []
            self._held[a][lo - a : hi - a].copy_(reduced[lo - offset : hi - offset])
            self._filled[a].append((lo, hi))
        if reduced.is_cuda:
            self.ready = torch.cuda.Event()
            self.ready.record()
        return [(lo, hi) for lo, hi, _ in without([(offset, end, 0)], touched)]

    def pop(self, a: int, b: int, staging: torch.Tensor) -> torch.Tensor | None:
        """Chunk [a, b)'s held gradient, given up to the caller; None when the chunk is not held whole, after
        writing what it holds into `staging` (the caller reads staging then)."""
        held, filled = self._held.pop(a, None), self._filled.pop(a, [])
        if held is None:
            return None
        if sum(hi - lo for lo, hi in filled) == b - a:
            return held
        if self.ready is not None:  # written on the reducing stream
            self.ready.synchronize()
        for lo, hi in filled:
            staging[lo:hi].copy_(held[lo - a : hi - a])
        return None

    def staged(self, staging: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """The 16-bit gradient of [lo, hi) as staging would hold it had nothing been held (a host copy)."""
        out = staging[lo:hi].clone()
        if self.ready is not None and self._filled:
            self.ready.synchronize()
        for a, pieces in self._filled.items():
            for p, q in pieces:
                s, e = max(p, lo), min(q, hi)
                if s < e:
                    out[s - lo : e - lo].copy_(self._held[a][s - a : e - a])
        return out

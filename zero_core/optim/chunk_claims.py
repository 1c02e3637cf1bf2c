"""The host share's chunks, claimed one at a time by whichever side of the streamed update is free
(`zero_core.offload_stream_balance`).

The host and the GPU's streamed update (streamed_update.py) run at rates that differ between machines of one
kind (host memory bandwidth, PCIe), so a fixed split leaves one side idle at the end of every update. Here the
host takes its chunks from the front, in partition order, and the GPU, once its own streamed chunks are queued,
takes the rest from the back, until the two meet. The device kernel rounds as the host's does
(kernels/triton_adamw.py), so who updates a chunk changes no bit of the result, only when it is done.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator


class ChunkClaims:
    """`starts` (partition order) handed out once each: from the front to the host, from the back to the GPU."""

    def __init__(self, starts: list[int]) -> None:
        self._starts = starts
        self._front, self._back = 0, len(starts)
        self._lock = threading.Lock()
        self.from_back: list[int] = []  # what the GPU took, in the order it took them

    @classmethod
    def of(cls, numel: int, chunk: int, gpu_starts: set[int]) -> ChunkClaims:
        """The chunks of a `numel`-element partition that are not the GPU's own."""
        return cls([a for a in range(0, numel, chunk) if a not in gpu_starts])

    def front(self) -> int | None:
        """The next chunk in partition order, or None once every chunk is taken."""
        with self._lock:
            if self._front >= self._back:
                return None
            self._front += 1
            return self._starts[self._front - 1]

    def back(self) -> int | None:
        """The last chunk not yet taken, or None once every chunk is taken."""
        with self._lock:
            if self._front >= self._back:
                return None
            self._back -= 1
            self.from_back.append(self._starts[self._back])
            return self._starts[self._back]


def host_chunks(segments: Iterable[tuple[int, int, dict]], chunk: int, gpu_starts: set[int],
                claims: ChunkClaims | None) -> Iterator[tuple[int, int, dict, int]]:
    """(lo, hi, views from element lo on, chunk start) for each chunk the host updates itself, in partition order,
    over the states' `segments` (NVMe streams several): those `claims` hands the front, or else every chunk whose
    start is not one of the GPU's own."""
    for lo, hi, v in segments:
        if claims is not None:  # states in host memory (streaming needs them): one segment, the whole partition
            while (a := claims.front()) is not None:
                yield lo, hi, v, a
            return
        for a in range(lo, hi, chunk):
            if a not in gpu_starts:
                yield lo, hi, v, a

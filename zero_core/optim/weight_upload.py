"""Sending the host update's 16-bit output to the device as it is produced (optimizer offload).

The host step writes each finished chunk's 16-bit weights into one pinned host buffer and calls the
uploader, which copies the chunk up on its own stream while the host goes on with the next chunk; at
stages 1-2 it also starts each bucket's all-gather as soon as that bucket's copies are queued. The
device waits only for the last copy: nothing here waits on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .. import comm
from ..step_timer import StepBreakdown


class WeightUploader:
    """Sends 16-bit chunks from the host output to the device as the host step produces them, and
    all-gathers each bucket (stages 1-2: `bucket_ends[i]` is where bucket i's shard ends in the partition)
    as soon as its copies are queued. Nothing here waits on the host.

    `pieces` are (partition offset, destination view) pairs: one flat device partition (stage 3), or each
    bucket's shard inside its full working buffer (stages 1-2, so no separate 16-bit partition exists on
    the device). On CUDA the copies run on their own stream; on the CPU they are plain copies."""

    def __init__(
        self,
        src: torch.Tensor,
        pieces: Sequence[tuple[int, torch.Tensor]],
        breakdown: StepBreakdown,
        bucket_ends: Sequence[int] = (),
        gather: Callable[[int], None] | None = None,
    ) -> None:
        self.src, self.breakdown = src, breakdown
        self.pieces = sorted(pieces, key=lambda piece: piece[0])
        self.numel = max(off + view.numel() for off, view in self.pieces)
        self.bucket_ends, self.gather = list(bucket_ends), gather
        self.side = comm.SideStream(self.pieces[0][1].device)  # the copy stream (none on the CPU)
        self.gathered = 0

    def begin(self) -> None:
        """Order the copies after everything already queued on the compute stream (readers of the destination)."""
        self.gathered = 0
        self.side.wait_current()

    def __call__(self, a: int, b: int) -> None:
        self.upload(a, b)
        self._gather_up_to(b)

    def upload(self, a: int, b: int) -> None:
        """Copy output[a:b] up (on the copy stream), without gathering."""
        start = self.breakdown.event(self.side.stream)
        with torch.cuda.stream(self.side.stream):
            for off, view in self.pieces:
                lo, hi = max(a, off), min(b, off + view.numel())
                if lo < hi:
                    view[lo - off : hi - off].copy_(self.src[lo:hi], non_blocking=True)
        self.breakdown.span("h2d", start, self.breakdown.event(self.side.stream))

    def _gather_up_to(self, end: int) -> None:
        joined = False
        while (
            self.gather is not None and self.gathered < len(self.bucket_ends) and self.bucket_ends[self.gathered] <= end
        ):
            if not joined:
                self.side.join()
                joined = True
            self.gather(self.gathered)
            self.gathered += 1

    def finish(self) -> None:
        """The compute stream waits for the last copy (no host sync); the remaining buckets are gathered."""
        tail = self.breakdown.event()
        self.side.join()
        self.breakdown.span("h2d_tail", tail, self.breakdown.event())
        self._gather_up_to(self.numel)

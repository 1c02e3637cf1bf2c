"""Start-up writes to the NVMe state file: the master filled front to back, the moments zero.

The caller hands over the flat master in order, in pieces of any size; each record is written as one chunk
once its master region is full (master, then the two moment regions as zeros): after `close()` the file holds
every record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .states import NAMES

if TYPE_CHECKING:
    from .nvme_states import NvmeStates


class NvmeWriter:
    """Start-up: fills the master front to back, record by record, with zero moments."""

    def __init__(self, store: NvmeStates) -> None:
        self.store, self.i, self.filled = store, 0, 0
        self.buf = store.buffers[0]
        self._start()

    def _start(self) -> None:
        if self.i < self.store.nchunks:
            self.buf.zero_()
            self.view = self.store._views(self.buf, self.i, ("master",))["master"]

    def write(self, piece: torch.Tensor) -> None:
        piece = piece.reshape(-1)
        while piece.numel():
            take = min(piece.numel(), self.view.numel() - self.filled)
            self.view[self.filled : self.filled + take].copy_(piece[:take])
            self.filled += take
            piece = piece[take:]
            if self.filled == self.view.numel():
                self.store._wait(self.store._submit(True, self.i, self.buf, NAMES))
                self.i, self.filled = self.i + 1, 0
                self._start()

    def close(self) -> None:
        assert self.i == self.store.nchunks, f"master filled {self.i} of {self.store.nchunks} chunks"
        self.store.wait_seconds = 0.0

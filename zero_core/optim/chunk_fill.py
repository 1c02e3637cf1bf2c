"""Elements of a state store's range arriving in any order, gathered into whole chunks of the store's grid.

Start-up writes (sharded initialisation, load_pretrained) arrive parameter by parameter, while a store takes
its masters a chunk at a time (an NVMe store: one whole record). A buffer is kept per chunk being filled and
handed to `on_chunk(lo, hi, values)` once every element expected there has arrived.
"""

from __future__ import annotations

from typing import Callable

import torch


class ChunkFill:
    def __init__(self, numel: int, chunk: int, on_chunk: Callable[[int, int, torch.Tensor], None],
                 expected: dict[int, int] | None = None) -> None:
        """`expected`: chunk -> elements that will arrive (padding never does); by default every element."""
        self.numel, self.chunk, self.on_chunk = numel, chunk, on_chunk
        self.left: dict[int, int] = dict(expected or {})  # chunk -> elements still to come
        self.open: dict[int, torch.Tensor] = {}
        self.peak_open = 0

    def put(self, offset: int, values: torch.Tensor) -> None:
        """Elements [offset, offset + values.numel()) are `values`."""
        pos, end_all = offset, offset + values.numel()
        while pos < end_all:
            c = pos // self.chunk
            lo = c * self.chunk
            end = min(end_all, lo + self.chunk)
            buf = self.open.get(c)
            if buf is None:
                buf = self.open[c] = torch.zeros(min(self.chunk, self.numel - lo), dtype=torch.float32)
                self.left.setdefault(c, buf.numel())
                self.peak_open = max(self.peak_open, len(self.open))
            buf[pos - lo : end - lo].copy_(values[pos - offset : end - offset])
            self.left[c] -= end - pos
            if self.left[c] == 0:
                self.on_chunk(lo, lo + buf.numel(), self.open.pop(c))
            pos = end

    def complete(self) -> bool:
        return not self.open and not any(self.left.values())

    def flush(self) -> None:
        """Hand over the chunks still open as they are (zeros where nothing arrived)."""
        for c in sorted(self.open):
            self.on_chunk(c * self.chunk, c * self.chunk + self.open[c].numel(), self.open[c])
        self.open.clear()

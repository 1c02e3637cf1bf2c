"""One rank's optimizer states split in two stores at a partition offset: the first `split` elements in
one store, the rest in another. Partial offload (`offload_optimizer.ratio` < 1) puts the first part in
device memory and the rest in host memory or on NVMe; `zero_core.nvme_host_ratio` splits an NVMe share
again, host memory first, so a partition can span all three.

It gives the same three ways in as the stores it joins (states.py), in partition coordinates, so
checkpoints, `full_state_dict` and `refresh_working_weights` see one partition: a checkpoint holds the
full per-rank partition whatever the split, and loads into any split, any offload or none.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .chunk_fill import ChunkFill
from .states import NAMES, TensorStates, Views


class SplitStates:
    def __init__(self, device_part: TensorStates, host_part) -> None:
        self.device_part, self.host_part = device_part, host_part
        self.split = device_part.numel  # partition elements [0, split) live on the device
        self.numel = device_part.numel + host_part.numel
        self.device = device_part.device  # where the step's counters and statistics live
        self.names = device_part.names
        self._host_fill: ChunkFill | None = None  # start-up writes to NVMe host states (sharded initialisation)

    def stream(self, names: tuple[str, ...] = NAMES, write_back: bool = True) -> Iterator[tuple[int, int, Views]]:
        if self.split:
            yield from self.device_part.stream(names, write_back)
        for lo, hi, views in self.host_part.stream(names, write_back):
            yield lo + self.split, hi + self.split, views

    def read(self, name: str, lo: int, hi: int) -> torch.Tensor:
        s = self.split
        if hi <= s:
            return self.device_part.read(name, lo, hi)
        if lo >= s:
            return self.host_part.read(name, lo - s, hi - s)
        return torch.cat([self.device_part.read(name, lo, s).cpu(), self.host_part.read(name, 0, hi - s).cpu()])

    def write_master(self, lo: int, hi: int, values: torch.Tensor) -> None:
        """Start-up (sharded initialisation): master elements [lo, hi) of the partition, split at the boundary."""
        s = self.split
        if lo < s:
            self.device_part.write_master(lo, min(hi, s), values[: min(hi, s) - lo])
        if hi > s:
            start = max(lo, s)
            if hasattr(self.host_part, "chunk"):  # NVMe states take whole chunks of their own, offset by the split
                self._host_chunks().put(start - s, values[start - lo:])
            else:
                self.host_part.write_master(start - s, hi - s, values[start - lo:])

    def _host_chunks(self) -> ChunkFill:
        if self._host_fill is None:
            self._host_fill = ChunkFill(self.host_part.numel, self.host_part.chunk, self.host_part.write_master)
        return self._host_fill

    def finish_master(self) -> None:
        """Start-up is over: host chunks that padding left incomplete are written as they are (zeros there)."""
        if self._host_fill is not None:
            self._host_fill.flush()
            self._host_fill = None
        if isinstance(self.host_part, SplitStates):
            self.host_part.finish_master()

    @property
    def wait_seconds(self) -> float:
        """Time callers spent blocked on NVMe reads and writes (the step's nvme_wait), 0 without NVMe."""
        return getattr(self.host_part, "wait_seconds", 0.0)

    def writer(self) -> SplitWriter:
        return SplitWriter(self.device_part.writer(), self.host_part.writer(), self.split)

    def close(self) -> None:
        self.device_part.close()
        self.host_part.close()


class SplitWriter:
    """Fills the device part front to back, then the host part."""

    def __init__(self, first, second, split: int) -> None:
        self.first, self.second, self.left = first, second, split

    def write(self, piece: torch.Tensor) -> None:
        head = min(self.left, piece.numel())
        if head:
            self.first.write(piece[:head])
            self.left -= head
        if head < piece.numel():
            self.second.write(piece[head:])

    def close(self) -> None:
        self.first.close()
        self.second.close()


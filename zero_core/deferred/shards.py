"""What the engine keeps of a deferred model's initial values: this rank's stage-3 shards, or everything.

At stage 3 no partition-sized buffer is ever made for them: the partition is assembled in chunks, each
allocated when a parameter first lands in it and handed to the optimizer's state store (device memory,
host memory or the NVMe file) as soon as every element of it has arrived. Parameters arrive in
construction order, which is close to partition order, so only a chunk or two are open at once.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from checkpoints.layout import FlatLayout

from ..optim.chunk_fill import ChunkFill
from .materialise import materialiser

ASSEMBLY_CHUNK_NUMEL = 4 << 20  # elements per assembly chunk where the store has no chunk size of its own


class ChunkAssembler:
    """Collects partition elements in any order; `on_chunk(lo, hi, values)` once [lo, hi) is complete."""

    def __init__(
        self, layout: FlatLayout, rank: int, chunk: int, on_chunk: Callable[[int, int, torch.Tensor], None],
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.on_close = on_close
        expected: dict[int, int] = {}  # chunk -> parameter elements to come (padding never comes)
        self.pieces: dict[int, list[tuple[int, int]]] = {}  # parameter index -> (partition offset, param start, numel)
        for f in layout.fragments(rank):
            self.pieces.setdefault(f.param_index, []).append((f.partition_offset, f.param_start, f.numel))
            for c in range(f.partition_offset // chunk, (f.partition_offset + f.numel - 1) // chunk + 1):
                lo, hi = max(f.partition_offset, c * chunk), min(f.partition_offset + f.numel, (c + 1) * chunk)
                expected[c] = expected.get(c, 0) + hi - lo
        self.fill = ChunkFill(layout.partition_numel, chunk, on_chunk, expected)

    def put(self, index: int, value: torch.Tensor) -> None:
        """Parameter `index` (a layout slot) has its full value `value`."""
        flat = value.reshape(-1)
        for offset, start, n in self.pieces.get(index, ()):
            self.put_piece(offset, flat[start : start + n])

    def put_piece(self, offset: int, values: torch.Tensor) -> None:
        """Partition elements [offset, offset + values.numel()) are `values`."""
        self.fill.put(offset, values)

    def close(self) -> None:
        assert self.fill.complete(), "a parameter of the partition was never delivered"
        if self.on_close is not None:
            self.on_close()


def assembler_for(layout: FlatLayout, rank: int, states: Any) -> ChunkAssembler:
    """Assembles `rank`'s partition into the optimizer's masters, in the store's own chunks."""
    return ChunkAssembler(layout, rank, getattr(states, "chunk", ASSEMBLY_CHUNK_NUMEL), states.write_master,
                          getattr(states, "finish_master", None))


def shard_into(
    model: torch.nn.Module,
    layout: FlatLayout,
    params: list[torch.nn.Parameter],
    rank: int,
    device: torch.device,
    dtype: torch.dtype,
    states: Any,
) -> None:
    """Materialise `model` and write this rank's fp32 shards straight into the optimizer's masters
    (`states`: optim/states.py, moments already zero). Trainable parameters become empty placeholders (the
    stage makes them views of its gathered buffers); frozen ones are kept whole on `device`."""
    slot_of = {id(p): i for i, p in enumerate(params)}
    r = rank if layout.world_size > 1 else 0
    assembler = assembler_for(layout, r, states)

    def take(p: torch.nn.Parameter, value: torch.Tensor) -> torch.Tensor:
        i = slot_of.get(id(p))
        if i is None:  # frozen: replicated, whole
            return value.clone().to(device)
        assembler.put(i, value)
        return torch.empty(0, dtype=dtype, device=device)

    materialiser(model, device).run(take)
    assembler.close()


def materialise_whole(model: torch.nn.Module) -> None:
    """Every tensor of a deferred model real on the CPU (stages 0-2 keep every weight on every rank)."""
    materialiser(model, torch.device("cpu")).run(lambda p, value: value.clone())

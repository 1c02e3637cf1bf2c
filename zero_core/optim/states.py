"""Where a rank's fp32 optimizer states live: tensors (device or host RAM) or a file on NVMe.

Both stores give the same three ways in, so the optimizer step, checkpoints, `full_state_dict` and
`refresh_working_weights` never ask which one they have:

    for lo, hi, views in states.stream(): ...          # views["master"] = master[lo:hi], etc.; edits are kept
    states.read("master", lo, hi)                      # a copy or a view of one state's elements
    w = states.writer(); w.write(piece); ...; w.close()  # fill the master in order, moments zero (start-up)

`TensorStates` streams the whole partition as one piece; `NvmeStates` (nvme_states.py) streams it in
large chunks, reading ahead and writing back behind the caller.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .. import comm
from ..config_errors import ConfigError  # a ValueError: callers catching that still do

NAMES = ("master", "exp_avg", "exp_avg_sq")
Views = dict[str, torch.Tensor]


class TensorStates:
    """The fp32 master and Adam moments of one partition as three tensors on `device`.

    In host memory they are not pinned: no GPU copy ever reads them (gradients arrive in, and 16-bit
    weights leave from, pinned staging buffers), and pinned allocations are rounded up to powers of two.
    """

    def __init__(self, numel: int, device: torch.device, names: tuple[str, ...] = NAMES) -> None:
        self.numel, self.device, self.names = numel, device, names
        for n in names:  # Adam's moments, or only the master where a client optimizer keeps its own state
            setattr(self, n, comm.host_buffer(numel, torch.float32, pin=False) if device.type == "cpu"
                    else torch.zeros(numel, dtype=torch.float32, device=device))

    def part(self, lo: int, hi: int) -> TensorStates:
        """A store over elements [lo, hi) of this one: views, no copy (partial offload moving a share away)."""
        out = TensorStates.__new__(TensorStates)
        out.numel, out.device, out.names = hi - lo, self.device, self.names
        for n in self.names:
            setattr(out, n, getattr(self, n)[lo:hi])
        return out

    def stream(self, names: tuple[str, ...] = NAMES, write_back: bool = True) -> Iterator[tuple[int, int, Views]]:
        yield 0, self.numel, {n: getattr(self, n) for n in names if n in self.names}

    def read(self, name: str, lo: int, hi: int) -> torch.Tensor:
        return getattr(self, name)[lo:hi]

    def writer(self) -> TensorWriter:
        return TensorWriter(self.master)

    def write_master(self, lo: int, hi: int, values: torch.Tensor) -> None:
        """Start-up in any order (sharded initialisation): master elements [lo, hi); moments stay zero."""
        self.master[lo:hi].copy_(values)

    def close(self) -> None:
        pass


class TensorWriter:
    """Fills a tensor front to back."""

    def __init__(self, dst: torch.Tensor) -> None:
        self.dst, self.pos = dst, 0

    def write(self, piece: torch.Tensor) -> None:
        self.dst[self.pos : self.pos + piece.numel()].copy_(piece)
        self.pos += piece.numel()

    def close(self) -> None:
        assert self.pos == self.dst.numel(), f"master filled {self.pos} of {self.dst.numel()} elements"


def state_sum(states: TensorStates, name: str) -> float:
    """sum of one state in float64 (tests and diagnostics; streams, so it works on NVMe too)."""
    return sum(float(v[name].double().sum()) for _, _, v in states.stream((name,), write_back=False))


def make_states(numel: int, device: torch.device, offload, aio, rank: int, names: tuple[str, ...] = NAMES):
    """The store for this rank's states: on `device`, in host RAM (`offload.device == "cpu"`) or in a
    file under `offload.nvme_path` ("nvme"). NVMe problems (missing or read-only path, too little
    space) are checked before anything is allocated and raised on every rank as the same one line."""
    kind = offload.device if offload is not None else "none"
    if kind == "none":
        return TensorStates(numel, device, names)
    if kind == "cpu":
        return TensorStates(numel, torch.device("cpu"), names)

    from .nvme_states import (
        NVME_CHUNK_NUMEL,
        NvmeStates,
        check_path,
        chunk_numel_from_env,
        file_bytes,
    )

    chunk = chunk_numel_from_env(NVME_CHUNK_NUMEL, "ZERO_CORE_NVME_CHUNK_NUMEL")
    _agree(check_path(offload.nvme_path, file_bytes(numel, chunk), comm.local_world_size()))
    store, problem = None, None
    try:
        store = NvmeStates(numel, offload.nvme_path, rank, chunk=chunk, buffer_count=offload.buffer_count,
                           block_size=aio.block_size, queue_depth=aio.queue_depth, thread_count=aio.thread_count)
    except ValueError as e:
        problem = str(e)
    try:
        _agree(problem)
    except ValueError:
        if store is not None:
            store.close()
        raise
    return store


def _agree(problem: str | None) -> None:
    """Raise the first rank's problem on every rank (a rank that failed alone would leave the others waiting)."""
    problems = comm.all_gather_object(problem, what="all-gather of the NVMe offload set-up status")
    for r, p in enumerate(problems):
        if p:
            raise ConfigError(p if p == problem or len(problems) == 1 else f"{p} (reported by rank {r})")

"""Process-group set-up and the few collectives the engine uses.

A world of one needs no process group, so a single-process run (a notebook, a unit test) works with
no launcher. Collectives return nothing; they take tensors on a device the backend reaches, except
`broadcast_` and `all_reduce_sum_on`, which carry a host tensor through the GPU when the backend is NCCL.

Each collective takes `what` (e.g. "all-gather of stage-3 unit 3"): when the backend reports that a
peer never joined (gloo: "Timed out waiting ...ms") or went away ("Connection closed by peer"), the
error becomes one `CollectiveError` line naming this rank, that collective and the fix, instead of
the backend's text or a silent hang. The timeout itself is the process group's (`set_timeout`, comm_errors.py).
On GPUs NCCL's watchdog enforces the same timeout and stops the process with its own report.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from .comm_errors import CollectiveError
from .comm_errors import CollectiveTimeout as CollectiveTimeout  # re-exported: callers catch comm.CollectiveTimeout
from .comm_errors import named as _named
from .comm_errors import set_timeout as set_timeout  # re-exported: the engine sets comm_timeout_s through comm
from .comm_errors import translate
from .comm_release import backend_holds
from .host_pages import empty_host
from .pinned import empty_pinned


def ensure_process_group(device: torch.device) -> None:
    """Use the default process group, or create it from torchrun's environment if there is none."""
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(
            f"WORLD_SIZE is set but {', '.join(missing)} is not; launch with torchrun (or zbench run) "
            "or call torch.distributed.init_process_group before zero_core.initialize"
        )
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)


def free_port() -> int:
    """A TCP port on this host free right now, for a world of one's rendezvous (never a fixed one: two such runs
    on one host would collide)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def world_size() -> int:
    """Data-parallel world size (1 without a process group)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def local_rank() -> int:
    """This process's rank on its host, as the launcher set LOCAL_RANK (0 when run alone)."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def local_world_size() -> int:
    """Ranks on this host, as the launcher set LOCAL_WORLD_SIZE (1 when run alone): they share its memory and disk."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)


def pick_device() -> torch.device:
    """The device this rank trains on: its local GPU if there is one, else the CPU."""
    if torch.cuda.is_available():
        index = local_rank() % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


# torch 2.13 renamed the flat collectives; older releases (>= 2.5) only have the *_tensor names.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def simulated() -> bool:
    """Whether this process stands for rank 0 of a larger world with no peers (torch's fake process group,
    `zbench run --simulate-ranks`). Its collectives return at once and, depending on the torch release,
    leave outputs unwritten, so the flat collectives below write this rank's own share instead: the
    memory, shapes and kernels of an N-rank run, with finite numbers and no communication."""
    return dist.is_initialized() and dist.get_backend() == "fake"


def _own_slice(flat: torch.Tensor) -> torch.Tensor:
    return flat.view(world_size(), -1)[rank()]


def all_reduce_sum(t: torch.Tensor, what: str = "all-reduce") -> None:
    """In-place sum across ranks."""
    if world_size() > 1:
        with _named(what), backend_holds(t):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)


def reduce_scatter_sum(out: torch.Tensor, full: torch.Tensor, what: str = "reduce-scatter") -> None:
    """Sum `full` across ranks and keep this rank's equal slice in `out`."""
    if world_size() > 1 and simulated():
        out.copy_(_own_slice(full))
    elif world_size() > 1:
        with _named(what), backend_holds(out, full):
            _reduce_scatter(out, full, op=dist.ReduceOp.SUM)
    else:
        out.copy_(full)


def all_gather_flat(full: torch.Tensor, shard: torch.Tensor, what: str = "all-gather") -> None:
    """Concatenate every rank's `shard` into `full` (rank order)."""
    if world_size() > 1 and simulated():
        _gather_own(full, shard)
    elif world_size() > 1:
        # .data: writing through an alias with its own version counter keeps autograd's saved views
        # of these parameters valid after the re-gather (stage 3 re-gathers between forward and backward).
        alias = full.data
        with _named(what), backend_holds(alias, shard):
            _all_gather(alias, shard)
    else:
        full.data.copy_(shard)


def _gather_own(full: torch.Tensor, shard: torch.Tensor) -> None:
    """A simulated all-gather. Stages 1-2 update their shard inside `full`: the other slots keep the last
    weights they had. Elsewhere (stage 3's freshly allocated units) this rank's slot gets its shard and the
    others zeros: the whole unit written, as a real all-gather writes it. Not copies of this shard: a copy
    lands one tensor's values in another's place (a LayerNorm's ones as a row of an MLP weight), and at
    n_embd 8192 that row adds ~5,000 to one feature per block: fp16 (at most 65,504) overflowed at 16 blocks."""
    slots, me = full.data.view(world_size(), -1), rank()
    if slots[me].data_ptr() != shard.data_ptr():
        slots[:me].zero_()
        slots[me + 1 :].zero_()
        slots[me].copy_(shard)


class PendingCollective:
    """An asynchronous collective in flight; `wait()` orders the current stream after it (on the CPU it
    blocks) and turns a backend failure into the same one-line errors as the blocking collectives."""

    def __init__(self, work: Any, what: str) -> None:
        self.work, self.what, self.started = work, what, time.monotonic()

    def wait(self) -> None:
        if self.work is None:
            return
        start = self.started
        try:
            self.work.wait()
        except RuntimeError as e:
            err = e if isinstance(e, CollectiveError) else translate(e, self.what, time.monotonic() - start)
            if err is e:
                raise
            raise err from e
        finally:
            self.work = None


def all_gather_flat_async(full: torch.Tensor, shard: torch.Tensor, what: str = "all-gather") -> PendingCollective:
    """`all_gather_flat` started now and finished by the returned handle's `wait()`."""
    if world_size() > 1 and simulated():
        _gather_own(full, shard)
    elif world_size() > 1:
        alias = full.data
        with _named(what), backend_holds(alias, shard):
            return PendingCollective(_all_gather(alias, shard, async_op=True), what)
    else:
        full.data.copy_(shard)
    return PendingCollective(None, what)


def host_buffer(numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A zeroed CPU buffer, page-locked when a GPU will copy to or from it (async copies need pinned memory), on
    2 MiB pages where the host grants them (host_pages.py)."""
    pinned = pin and torch.cuda.is_available()
    try:
        return (empty_pinned(numel, dtype) if pinned else empty_host(numel, dtype)).zero_()
    except RuntimeError as e:
        gib = numel * torch.empty((), dtype=dtype).element_size() / 2**30
        raise MemoryError(
            f"cannot allocate {gib:.2f} GiB of {'pinned ' if pinned else ''}host memory for offload "
            f"({str(e).splitlines()[0]}); free host memory, use more ranks, or turn offload off"
        ) from None


def all_reduce_sum_on(t: torch.Tensor, device: torch.device, what: str = "all-reduce") -> None:
    """In-place sum of `t` across ranks, hopping to `device` when the backend cannot reach t's device
    (NCCL only sees GPU memory; offloaded optimizer statistics live on the CPU)."""
    if world_size() == 1:
        return
    with _named(what):
        _in_place_on(t, device, dist.all_reduce)


def _in_place_on(t: torch.Tensor, device: torch.device, collective: Callable[[torch.Tensor], Any]) -> None:
    """Run the in-place `collective` on `t`, through a copy on `device` when `t` lives elsewhere."""
    hop = t if t.device == device else t.to(device)
    with backend_holds(hop):
        collective(hop)
    if hop is not t:
        t.copy_(hop)


def reaches(device: torch.device) -> bool:
    """Whether the default process group's backend runs collectives on tensors of `device`: NCCL sees only GPU
    memory, so a host tensor (a random state, a host-built staging buffer) must hop through this rank's GPU."""
    backend = str(dist.get_backend())
    if ":" in backend:  # one backend per device type, e.g. "cpu:gloo,cuda:nccl"
        return any(part.split(":")[0] == device.type for part in backend.split(","))
    return backend != "nccl" or device.type == "cuda"


def hop_device() -> torch.device:
    """Where a tensor the backend cannot reach goes for a collective: this rank's current GPU."""
    return torch.device("cuda", torch.cuda.current_device())


def broadcast_(t: torch.Tensor, src: int = 0, what: str = "broadcast") -> None:
    """Overwrite `t` with rank `src`'s value (through this rank's GPU when the backend cannot reach `t`)."""
    if world_size() > 1:
        with _named(what):
            _in_place_on(t, t.device if reaches(t.device) else hop_device(), lambda x: dist.broadcast(x, src))


def barrier(what: str = "barrier") -> None:
    if world_size() > 1:
        with _named(what):
            dist.barrier()


def all_gather_object(obj: Any, what: str = "all-gather of objects") -> list[Any]:
    """Every rank's picklable `obj`, in rank order."""
    if world_size() == 1 or simulated():
        return [obj] * world_size()  # simulated: every rank as rank 0
    out: list[Any] = [None] * world_size()
    with _named(what):
        dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0, what: str = "broadcast of an object") -> Any:
    """Rank `src`'s picklable `obj` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    with _named(what):
        dist.broadcast_object_list(box, src)
    return box[0]


class SideStream:
    """A CUDA stream for communication overlapped with compute; a no-op on the CPU."""

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" and enabled else None

    def wait_current(self) -> None:
        """Order the side stream after the work queued so far on the current stream."""
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))

    @contextmanager
    def after_current(self) -> Iterator[None]:
        """Run the block on the side stream, ordered after work queued so far on the current stream."""
        self.wait_current()
        with torch.cuda.stream(self.stream):  # a no-op context for None (the CPU)
            yield

    def keep_alive(self, t: torch.Tensor) -> None:
        """Tell the allocator `t` is in use on the side stream, so freeing it elsewhere waits."""
        if self.stream is not None:
            t.record_stream(self.stream)

    def join(self) -> None:
        """Make the current stream wait for everything queued on the side stream."""
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)

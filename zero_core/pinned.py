"""Page-locked host memory of exactly the size asked for.

torch's pinned allocator (`pin_memory=True`) caches blocks in powers of two: a 17 GB staging buffer takes
32 GiB of page-locked RAM, which at the sizes of optimizer offload is the difference between a model that
fits in host memory and one that does not. Large buffers are therefore ordinary allocations that the CUDA
driver is asked to lock in place (cudaHostRegister), and unlocked when the tensor is dropped. Small ones,
and any that the driver refuses to register, go through torch's allocator.
"""

from __future__ import annotations

import weakref

import torch

from .host_pages import empty_host

REGISTER_MIN_BYTES = 64 << 20  # below this the power-of-two rounding costs little, and torch's cache helps
_locked: dict[int, int] = {}  # start -> end of each range this module locked (torch's is_pinned cannot see them)


def empty_pinned(shape: int | tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor whose pages are locked for asynchronous GPU copies (CUDA only)."""
    size = torch.Size([shape]) if isinstance(shape, int) else torch.Size(shape)
    nbytes = size.numel() * dtype.itemsize
    if nbytes >= REGISTER_MIN_BYTES:
        t = empty_host(size.numel(), dtype).view(size)  # on 2 MiB pages where granted
        if _register(t, nbytes) == 0:
            return t
        del t  # refused: freed before torch's allocator makes the pinned one
    return torch.empty(size, dtype=dtype, pin_memory=True)


def _register(t: torch.Tensor, nbytes: int) -> int:
    """Ask the driver to lock `nbytes` from t's first element; CUDA's answer (0: locked, and unlocked when the memory
    goes: the storage outlives every view of it, and its Python object lives exactly as long)."""
    code = int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 0))
    if code == 0:
        _locked[t.data_ptr()] = t.data_ptr() + nbytes
        weakref.finalize(t.untyped_storage(), _unlock, t.data_ptr())
    return code


def _unlock(start: int) -> None:
    if _locked.pop(start, None) is not None:  # once: unregistering twice would leave CUDA an error to report
        torch.cuda.cudart().cudaHostUnregister(start)


def is_locked(t: torch.Tensor) -> bool:
    """Whether CPU tensor `t` lies in page-locked memory: torch's pinned allocator's, or a range locked here."""
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    return any(a <= start and end <= b for a, b in _locked.items()) or t.is_pinned()


class PageLockError(RuntimeError):
    """The CUDA driver refused to page-lock host memory zero_core asked it to lock."""


def lock_in_place(t: torch.Tensor) -> bool:
    """Page-lock an existing CPU tensor's memory (for asynchronous copies of it); False if it already was.
    `unlock(t)` undoes it; otherwise it is undone when the memory goes. PageLockError if the driver refuses."""
    if not t.numel() or is_locked(t):
        return False
    nbytes = t.numel() * t.element_size()
    code = _register(t, nbytes)
    if code != 0:
        try:
            reason = str(torch.cuda.cudart().cudaGetErrorString(code))
        except (AttributeError, RuntimeError, TypeError):
            reason = "no description"
        mib = nbytes / 2**20
        raise PageLockError(f"page-locking {mib:,.0f} MiB of host memory failed (CUDA error {code}: {reason})")
    return True


def lock_all(tensors: list[torch.Tensor], fix: str) -> list[torch.Tensor]:
    """Page-lock each of `tensors` in place; those it locked (for `unlock`). If the driver refuses one, the ones
    locked so far are unlocked again and PageLockError says which share failed and `fix`."""
    done: list[torch.Tensor] = []
    try:
        for t in tensors:
            if lock_in_place(t):
                done.append(t)
    except PageLockError as e:
        for t in done:
            unlock(t)
        total = sum(t.numel() * t.element_size() for t in tensors) / 2**20
        raise PageLockError(f"{e} while locking {total:,.0f} MiB in place; {fix}") from None
    return done


def unlock(t: torch.Tensor) -> None:
    """Undo `lock_in_place(t)`."""
    _unlock(t.data_ptr())

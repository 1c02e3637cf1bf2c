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


def empty_pinned(shape: int | tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor whose pages are locked for asynchronous GPU copies (CUDA only)."""
    size = torch.Size([shape]) if isinstance(shape, int) else torch.Size(shape)
    nbytes = size.numel() * dtype.itemsize
    if nbytes >= REGISTER_MIN_BYTES:
        t = empty_host(size.numel(), dtype).view(size)  # on 2 MiB pages where granted
        cudart = torch.cuda.cudart()
        if int(cudart.cudaHostRegister(t.data_ptr(), nbytes, 0)) == 0:
            # unlocked when the memory goes: the storage outlives every view of it, and its Python object
            # lives exactly as long (torch keeps one per storage)
            weakref.finalize(t.untyped_storage(), cudart.cudaHostUnregister, t.data_ptr())
            return t
        del t  # refused: freed before torch's allocator makes the pinned one
    return torch.empty(size, dtype=dtype, pin_memory=True)

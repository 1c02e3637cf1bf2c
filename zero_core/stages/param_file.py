"""Stage-3 parameter offload to NVMe: this rank's 16-bit weight partition as a file mapping under nvme_path.

The partition is a shared mapping of a preallocated file, so it is backed by the disk, not by anonymous
host memory: the kernel reads a unit's pages in when its shard is copied up for the all-gather, and writes
pages the update changed back in the background, so they can be dropped again under memory pressure. Host
RAM then bounds only what is in use at once, and the largest model on one GPU is bounded by disk.

As the optimizer-state file (optim/nvme_states.py), the file is unlinked as soon as it is mapped: it has no
name, and its space is freed when the process ends, however it ends.
"""

from __future__ import annotations

import errno
import os
import socket

import torch

from .. import comm
from ..optim.nvme_states import check_path
from ..optim.states import _agree


def param_file(numel: int, dtype: torch.dtype, folder: str, rank: int) -> torch.Tensor:
    """A CPU tensor of `numel` elements of `dtype` backed by a new file in `folder` (zeros). Problems
    (missing or read-only folder, too little space) are raised on every rank as the same one line."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    _agree(check_path(folder, nbytes, comm.local_world_size(), section="offload_param",
                      what_needs="parameter partitions"))
    path = os.path.join(folder, f"zero_core-{socket.gethostname()}-pid{os.getpid()}-rank{rank}.params")
    problem, tensor = None, None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, max(nbytes, 1))
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise
                os.ftruncate(fd, max(nbytes, 1))  # no preallocation on this file system: sparse
        finally:
            os.close(fd)
        tensor = torch.from_file(path, shared=True, size=numel, dtype=dtype)
    except (OSError, RuntimeError) as e:
        problem = (f"cannot create the NVMe parameter file in '{folder}' ({getattr(e, 'strerror', None) or e}); "
                   "check zero_optimization.offload_param.nvme_path, its permissions and free space")
    finally:
        if os.path.exists(path):
            os.unlink(path)  # the mapping keeps the space; the name goes now
    _agree(problem)
    assert tensor is not None
    return tensor

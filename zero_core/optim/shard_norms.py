"""The gradient norm and non-finite count of a pass whose shards are never folded on the host (the lazy pass of
host_adam.py): one kernel per shard, where it was reduced, and the sum at the step.

Each reduced shard's norm goes into its own slot of a device buffer on the reduce stream as the shard arrives
(backward launches nothing more per shard for the statistics); the step scales them, squares and sums them
in one go. The buffer grows (on the reduce stream, so its memory is that stream's) until it holds a pass.
"""

from __future__ import annotations

import torch


class ShardNorms:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._norms: torch.Tensor | None = None
        self._count = 0
        self._scale = 1.0

    def begin(self, scale: float) -> None:
        """A new pass, whose reduced sums are multiplied by `scale` (1 / (world * loss scale))."""
        self._count, self._scale = 0, scale

    def add(self, reduced: torch.Tensor) -> None:
        """Record the norm of one reduced shard (on the current stream: the reduce stream on CUDA)."""
        norms, i = self._norms, self._count
        if norms is None or i == norms.numel():
            grown = torch.empty(max(64, 2 * i), dtype=torch.float64, device=self.device)
            if norms is not None:
                grown[:i].copy_(norms)
            self._norms = norms = grown
        # in fp64, as the reduce epilogue sums squares (kernels/): the clip coefficient follows the norm's last bits
        torch.linalg.vector_norm(reduced, dtype=torch.float64, out=norms[i])
        self._count = i + 1

    def stats(self) -> torch.Tensor:
        """[sum of the scaled shards' squared norms, shards with a non-finite value] of this pass (fp64)."""
        if self._norms is None or self._count == 0:
            return torch.zeros(2, dtype=torch.float64, device=self.device)
        scaled = self._norms[: self._count] * self._scale
        return torch.stack([(scaled * scaled).sum(), (~torch.isfinite(scaled)).sum().float()])

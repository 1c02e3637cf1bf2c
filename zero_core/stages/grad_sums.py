"""Stages 2-3 accumulating in 16 bits: reduced gradient shards summed across micro-steps in that precision.

DeepSpeed's default accumulation dtype is the working precision, so a bf16 (fp16) run adds each micro-step's
reduced gradients into a bf16 (fp16) partition and converts the sum to fp32 only at the boundary. Folding every
micro-step into the optimizer's fp32 gradient instead gives other numbers (fp32 accumulation, which
`data_types.grad_accum_dtype: "fp32"` asks for). Here each reduced shard is added into a running sum of the
accumulation dtype, and only the boundary's sum reaches the optimizer: it then sees one pass per window, as
without accumulation. With the optimizer offloaded the sums wait in host memory, as DeepSpeed's offload does,
so accumulation takes no device memory beyond the shard being added.

All of it runs on the stream that reduced the shard (grad_buckets.py), so each copy and add is ordered after
the reduction that produced its input.
"""

from __future__ import annotations

import torch

from .. import comm


class MicroStepSums:
    def __init__(self, dtype: torch.dtype, on_host: bool, device: torch.device) -> None:
        self.dtype = dtype
        self.on_host = on_host
        self.device = device
        self._sums: dict[int, torch.Tensor] = {}  # group -> its shard's sum over this window's earlier passes
        self._host: dict[int, torch.Tensor] = {}  # offload: group -> its host buffer, kept for later windows

    def restart(self) -> None:
        """A window begins: earlier passes' sums are not part of it."""
        self._sums = {}

    def so_far(self, g: int, scale: torch.Tensor) -> torch.Tensor:
        """Inside a window, read on request (never on the training path): group g's shard summed over the passes so
        far, as fp32 times `scale`, as the boundary's total reaches the optimizer."""
        held = self._sums.get(g)
        assert held is not None, "every pass reduces every group: a window's first backward leaves a sum for each"
        if self.on_host and self.device.type == "cuda":  # the copy into the host buffer is asynchronous
            torch.cuda.current_stream(self.device).synchronize()
        # one fp32 multiply, rounded alike on either side; the scale may live on the host (offload's scaler)
        return held.to(self.device).float() * scale.to(self.device)

    def add(self, g: int, reduced: torch.Tensor, final: bool) -> torch.Tensor | None:
        """Add group g's reduced shard to its sum; the total at the window's last pass (else None)."""
        earlier = self._sums.pop(g, None)
        if earlier is None:
            if final:  # no accumulation: the shard goes on as it is
                return reduced
            total = reduced.to(self.dtype)  # no copy when the dtypes agree
        else:
            total = earlier.to(self.device, non_blocking=True) if self.on_host else earlier
            total.add_(reduced.to(self.dtype))  # rounded to the accumulation dtype, as DeepSpeed's sum is
        if final:
            return total
        if self.on_host:
            held = self._host.get(g)
            if held is None:
                held = self._host[g] = comm.host_buffer(total.numel(), self.dtype, pin=self.device.type == "cuda")
            held.copy_(total, non_blocking=True)
            total = held
        self._sums[g] = total
        return None

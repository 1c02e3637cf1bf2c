"""Triton reduce epilogue: scale + (accumulate into) fp32 acc + fp64 sum of squares + non-finite flag, one pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .reference import FP32_MAX

# Memory-bound: 4096 elements over 8 warps = 16 per thread (4x 128-bit fp32 accesses), enough
# bytes in flight per SM on H100/H200 while keeping the partials buffer small (numel / 4096 floats).
BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _epilogue_kernel(
    reduced_ptr,
    acc_ptr,
    scale_ptr,
    partials_ptr,
    nonfinite_ptr,
    numel,
    ACCUMULATE: tl.constexpr,
    FMAX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    # int64 offsets: a rank's shard can exceed 2**31 elements.
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    scale = tl.load(scale_ptr)
    new = tl.load(reduced_ptr + offs, mask=mask, other=0.0).to(tl.float32) * scale
    if ACCUMULATE:
        new = tl.load(acc_ptr + offs, mask=mask, other=0.0) + new
    tl.store(acc_ptr + offs, new, mask=mask)
    # Masked lanes are 0 and add nothing. One partial per program, summed by torch afterwards:
    # a fixed reduction order, so sumsq is bit-identical run to run (float atomics would not be).
    # Squares and sums in fp64, as DeepSpeed takes gradient norms: in fp32 the norm drifts by up to ~1e-5.
    wide = new.to(tl.float64)
    tl.store(partials_ptr + pid, tl.sum(wide * wide, axis=0))
    # `not (|x| <= max)` is true for inf and NaN alike.
    bad = tl.max((~(tl.abs(new) <= FMAX)).to(tl.int32), axis=0)
    # Only programs that saw a bad value touch the flag: no contention on the common path.
    tl.atomic_max(nonfinite_ptr, bad, mask=bad > 0)


def reduce_epilogue(
    reduced: Tensor, acc: Tensor, scale: Tensor, accumulate: bool, sumsq: Tensor, nonfinite: Tensor
) -> None:
    """Triton launcher; same contract as ``zero_core.kernels.reduce_epilogue``."""
    numel = acc.numel()
    grid = triton.cdiv(numel, BLOCK)
    if grid == 0:
        return
    partials = torch.empty(grid, dtype=torch.float64, device=acc.device)
    _epilogue_kernel[(grid,)](
        reduced, acc, scale, partials, nonfinite, numel,
        ACCUMULATE=accumulate, FMAX=FP32_MAX, BLOCK=BLOCK, num_warps=NUM_WARPS,
    )
    sumsq.add_(partials.sum())

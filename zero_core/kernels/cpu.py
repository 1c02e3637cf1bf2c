"""Host kernels for CPU training and optimizer offload: torch's fused multi-threaded CPU Adam.

On the CPU there is no device to stay asynchronous with, so reading the skip flag and the clip
coefficient on the host costs nothing and lets one fused pass do the update; the reference's
torch.where formulation reads and writes every buffer several times.
"""

from __future__ import annotations

import torch
from torch import Tensor


def reduce_epilogue(
    reduced: Tensor, acc: Tensor, scale: Tensor, accumulate: bool, sumsq: Tensor, nonfinite: Tensor
) -> None:
    """Same contract as ``zero_core.kernels.reduce_epilogue``: two in-place passes, then the sum of squares.

    The non-finite test rides on the sum of squares: fp64 squares of fp32 values cannot overflow, so it is
    inf or NaN exactly when some element is.
    """
    s = float(scale[0])
    if accumulate:
        acc.add_(reduced, alpha=s)  # promotes to fp32 element by element
    else:
        scaled_copy(reduced, acc, s)
    add_sums(sum_of_squares(acc).reshape(1), sumsq, nonfinite)


# fp64 pieces of 512 KiB: converted and summed while in cache, one buffer reused for all of them
SQUARES_PIECE_NUMEL = 1 << 16


def sum_of_squares(t: Tensor) -> Tensor:
    """sum(t ** 2) of a 1-D fp32 tensor, in fp64 (a 0-dim tensor). Each square is exact in fp64, and the sum has
    the precision of DeepSpeed's fp64 gradient norms: an fp32 dot product of millions of elements is off by up
    to ~1e-5, enough to move the clip coefficient. No fp64 copy of the whole tensor is made."""
    if t.is_cuda:  # one kernel that widens as it reads (partial offload takes device shards' sums this way)
        return torch.linalg.vector_norm(t, dtype=torch.float64).square()
    total = torch.zeros((), dtype=torch.float64, device=t.device)
    if t.numel() == 0:
        return total
    buf = torch.empty(min(t.numel(), SQUARES_PIECE_NUMEL), dtype=torch.float64, device=t.device)
    for piece in t.split(SQUARES_PIECE_NUMEL):
        wide = buf[: piece.numel()]
        wide.copy_(piece)
        total += torch.dot(wide, wide)
    return total


def add_sums(sums: Tensor, sumsq: Tensor, nonfinite: Tensor) -> None:
    """Add each of `sums` (sums of squares of consecutive pieces) to `sumsq` in order; flag a non-finite one."""
    for ss in sums:
        sumsq.add_(ss)
        if not bool(torch.isfinite(ss)):
            nonfinite.fill_(1)


def scaled_copy(reduced: Tensor, acc: Tensor, s: float) -> None:
    """acc = reduced (promoted to fp32) * s, in place: the epilogue without accumulation. The offload
    step rebuilds gradient chunks with it, so they equal the folded ones bit for bit."""
    acc.copy_(reduced)
    acc.mul_(s)


def available() -> bool:
    return hasattr(torch, "_fused_adamw_") and hasattr(torch, "_fused_adam_")


def adamw_step(
    param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, out: Tensor | None, *,
    lr: Tensor, step: Tensor, coef: Tensor, skip: Tensor,
    beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool = True,
) -> None:
    """Same contract as ``zero_core.kernels.adamw_step``, for CPU tensors."""
    if int(skip[0]) != 0:
        return
    c = float(coef[0])
    fused = torch._fused_adamw_ if decoupled else torch._fused_adam_
    hyper = dict(lr=float(lr[0]), beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=False,
                 maximize=False, grad_scale=None, found_inf=None)
    if c == 1.0:
        fused([param], [grad], [exp_avg], [exp_avg_sq], [], [step], **hyper)
    else:
        # the clipped gradient is grad * coef, as the Triton kernel and DeepSpeed take it: fused Adam's grad_scale
        # would divide by 1 / coef, an fp32 ulp away from that product for about a tenth of the elements
        for a in range(0, param.numel(), CLIPPED_PIECE_NUMEL):
            b = min(param.numel(), a + CLIPPED_PIECE_NUMEL)
            fused([param[a:b]], [grad[a:b] * c], [exp_avg[a:b]], [exp_avg_sq[a:b]], [], [step], **hyper)
    if out is not None:
        out.copy_(param)


# A multiple of every vector width, so pieces never change which elements the fused kernel vectorises (bitwise the
# same result as one call); small enough that the scaled gradient of a piece stays in cache.
CLIPPED_PIECE_NUMEL = 1 << 16

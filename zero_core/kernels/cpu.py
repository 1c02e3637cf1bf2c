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
    """Same contract as ``zero_core.kernels.reduce_epilogue``, in two in-place passes and no temporaries.

    The non-finite test rides on the sum of squares: it is inf or NaN exactly when some element is,
    or when the squares overflow fp32 (a gradient that large is treated as an overflow too).
    """
    s = float(scale[0])
    if accumulate:
        acc.add_(reduced, alpha=s)  # promotes to fp32 element by element
    else:
        scaled_copy(reduced, acc, s)
    add_sums(torch.dot(acc, acc).reshape(1), sumsq, nonfinite)


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
    fused([param], [grad], [exp_avg], [exp_avg_sq], [], [step], lr=float(lr[0]), beta1=beta1, beta2=beta2,
          weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False,
          grad_scale=None if c == 1.0 else torch.tensor(1.0 / c), found_inf=None)  # grad_scale divides
    if out is not None:
        out.copy_(param)

"""Pure-torch reference kernels: the CPU path and the ground truth the Triton kernels are tested against.

They follow the same arithmetic order as the Triton kernels and never synchronise with the host:
device scalars (scale, lr, step, coef, skip) stay tensors and are combined with tensor ops only.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Largest finite fp32: the Triton kernel flags `not |x| <= FP32_MAX`, true for inf and NaN alike.
FP32_MAX = 3.4028234663852886e38


def reduce_epilogue(
    reduced: Tensor, acc: Tensor, scale: Tensor, accumulate: bool, sumsq: Tensor, nonfinite: Tensor
) -> None:
    """acc = (acc if accumulate else 0) + reduced.float() * scale[0], in place.

    Also adds sum(acc_new**2), the squares summed in fp64, into ``sumsq[0]`` and sets ``nonfinite[0] = 1`` if
    any element of acc_new is inf/NaN (the flag is never cleared here).
    """
    new = reduced.float() * scale
    if accumulate:
        acc.add_(new)
    else:
        acc.copy_(new)
    sumsq.add_(acc.double().square().sum())
    bad = (~torch.isfinite(acc).all()).to(torch.int32)
    torch.maximum(nonfinite, bad, out=nonfinite)


def bias_corrections(step: Tensor, beta1: float, beta2: float, lr: Tensor) -> tuple[Tensor, Tensor]:
    """(lr / (1 - beta1**step), sqrt(1 - beta2**step)) as fp32 device tensors.

    Computed in fp64 like torch.optim does on the host: in fp32, 1 - beta2**1 loses ~4 digits.
    """
    s = step.double()
    bc1 = 1.0 - torch.pow(beta1, s)
    bc2 = 1.0 - torch.pow(beta2, s)
    return (lr.double() / bc1).float(), bc2.sqrt().float()


def adamw_step(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    out: Tensor | None,
    *,
    lr: Tensor,
    step: Tensor,
    coef: Tensor,
    skip: Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled: bool = True,
) -> None:
    """One AdamW (decoupled) or Adam+L2 update in fp32; nothing is written when ``skip[0] != 0``.

    See ``zero_core.kernels.adamw_step`` for the full contract.
    """
    g = grad * coef
    if decoupled:
        p = param * (1.0 - lr.double() * weight_decay).float()
    else:
        g = g + weight_decay * param
        p = param
    m = beta1 * exp_avg + (1.0 - beta1) * g
    v = beta2 * exp_avg_sq + (1.0 - beta2) * g * g
    step_size, bc2_sqrt = bias_corrections(step, beta1, beta2, lr)
    p = p - step_size * (m / (v.sqrt() / bc2_sqrt + eps))
    # torch.where instead of `if skip.item()`: keeps the host out of the loop; old bits are kept exactly.
    keep = skip != 0
    param.copy_(torch.where(keep, param, p))
    exp_avg.copy_(torch.where(keep, exp_avg, m))
    exp_avg_sq.copy_(torch.where(keep, exp_avg_sq, v))
    if out is not None:
        out.copy_(torch.where(keep, out, p.to(out.dtype)))

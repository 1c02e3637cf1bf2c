"""Triton fused AdamW: reads grad/param/m/v once, writes param/m/v and the 16-bit copy once, and rounds as
torch's fused CPU AdamW does (the host's update in optimizer offload), so the two agree bitwise."""

from __future__ import annotations

import math

import triton
import triton.language as tl
from torch import Tensor

# Memory-bound (30 B/param with a bf16 copy): 2048 elements over 8 warps = 8 per thread, i.e. two
# 128-bit accesses per fp32 stream; 4 loads + 4 stores keep plenty of bytes in flight on H100/H200.
BLOCK = 2048
NUM_WARPS = 8


@triton.jit
def _adamw_kernel(
    param_ptr,
    grad_ptr,
    m_ptr,
    v_ptr,
    out_ptr,
    lr_ptr,
    step_ptr,
    coef_ptr,
    skip_ptr,
    numel,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    weight_decay,
    weight_decay64: tl.float64,
    log2_beta1: tl.float64,
    log2_beta2: tl.float64,
    DECOUPLED: tl.constexpr,
    HAS_OUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    # skip folds into the mask (as an empty range): a skipped step neither reads nor writes the buffers.
    # (`block_mask & scalar_bool` would be equivalent but the interpreter rejects its mask dtype.)
    limit = tl.where(tl.load(skip_ptr) == 0, numel, 0)
    mask = offs < limit

    # The step's scalars in fp64, then fp32, as torch's fused CPU AdamW takes them (its bias corrections are
    # double: 1 - beta2**1 in fp32 loses ~4 digits)
    lr = tl.load(lr_ptr).to(tl.float64)
    step = tl.load(step_ptr).to(tl.float64)
    bc1 = 1.0 - tl.exp2(step * log2_beta1)
    bc2 = 1.0 - tl.exp2(step * log2_beta2)
    neg_step_size = (-(lr / bc1)).to(tl.float32)
    bc2_sqrt = tl.sqrt(bc2).to(tl.float32)  # fp64: rounded to nearest (approximate roots are fp32 only)
    decay = (1.0 - lr * weight_decay64).to(tl.float32)
    coef = tl.load(coef_ptr)

    p = tl.load(param_ptr + offs, mask=mask, other=0.0)
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0) * coef
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    # Each rounding where torch's fused CPU AdamW (the host's update) rounds, so the two give the same bits: its
    # fused multiply-adds are tl.fma here, and the launch turns off the compiler's own contraction of a * b + c.
    if DECOUPLED:
        p = p * decay  # exactly p where weight_decay is 0 (decay 1)
    else:
        g = tl.where(weight_decay != 0.0, tl.fma(p, weight_decay, g), g)
    # m.lerp_(g, 1 - beta1), in the form torch picks by the weight's size
    if tl.abs(one_minus_beta1) < 0.5:
        m = tl.fma(one_minus_beta1, g - m, m)
    else:
        m = tl.fma(one_minus_beta1 - 1.0, g - m, g)
    v = tl.fma(one_minus_beta2 * g, g, v * beta2)
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p + tl.div_rn(neg_step_size * m, denom)
    tl.store(param_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    if HAS_OUT:
        tl.store(out_ptr + offs, p.to(out_ptr.dtype.element_ty), mask=mask)


def _log2(beta: float) -> float:
    # beta == 0 is legal (no momentum): 0**step == 0 for step >= 1, i.e. exp2(-inf).
    return math.log2(beta) if beta > 0 else -math.inf


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
    """Triton launcher; same contract as ``zero_core.kernels.adamw_step``."""
    numel = param.numel()
    grid = triton.cdiv(numel, BLOCK)
    if grid == 0:
        return
    _adamw_kernel[(grid,)](
        param, grad, exp_avg, exp_avg_sq, param if out is None else out,
        lr, step, coef, skip, numel,
        1.0 - beta1, beta2, 1.0 - beta2, eps, weight_decay, weight_decay, _log2(beta1), _log2(beta2),
        DECOUPLED=decoupled, HAS_OUT=out is not None, BLOCK=BLOCK, num_warps=NUM_WARPS,
        enable_fp_fusion=False,  # no a * b + c contracted beyond the kernel's own tl.fma: the host's roundings
    )

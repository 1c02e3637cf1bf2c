"""The gradient norm and clip coefficient in DeepSpeed 0.19.8's arithmetic (zero_core/optim/clip_norm.py), the sum of
squares under it in fp64, and the clipped gradient as grad * coefficient on the CPU kernel. End to end against
DeepSpeed's own runs: tests/test_deepspeed_bf16.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zero_core.kernels import cpu, reference
from zero_core.optim.clip_norm import clip_coefficient, norm_dtype

NORMS = [1.387903702560072, 0.9072432828883694, 1.5795081563314493, 3.0000001, 0.2]


@pytest.mark.parametrize("clip", [1.0, 0.3])
def test_each_stage_takes_its_deepspeed_stages_coefficient(clip):
    f32 = np.float32
    for n in NORMS:
        at = {s: clip_coefficient(torch.tensor([n], dtype=norm_dtype(s)), clip, s).item() for s in (0, 1, 3)}
        # stages 1-2: fp32 tensors throughout, 1 / max(1, (norm + 1e-6) / clip)
        assert at[1] == f32(f32(1.0) / max(f32(1.0), (f32(n) + f32(1e-6)) / f32(clip)))
        # stage 3: the same in fp64, rounded to fp32 once
        assert at[3] == f32(1.0 / max(1.0, (n + 1e-6) / clip))
        # stage 0, as DeepSpeed's engine clips there: min(1, clip / (norm + 1e-6)), fp32 tensors
        assert at[0] == min(f32(1.0), f32(clip) / (f32(n) + f32(1e-6)))
    assert norm_dtype(3) == torch.float64 and norm_dtype(2) == torch.float32


def test_the_fp32_and_fp64_arithmetic_give_coefficients_an_ulp_apart():
    """Why the stage matters: DeepSpeed's stage-3 norm of a 2-rank run gives another fp32 coefficient than its
    fp32 rounding does under stages 1-2's arithmetic."""
    n = 1.387903702560072
    at3 = clip_coefficient(torch.tensor([n], dtype=torch.float64), 1.0, 3)
    at2 = clip_coefficient(torch.tensor([n], dtype=torch.float32), 1.0, 2)
    assert at3.dtype == at2.dtype == torch.float32 and at3.item() != at2.item()
    assert abs(at3.item() - at2.item()) <= float(torch.finfo(torch.float32).eps)


def test_the_epilogues_sum_of_squares_is_fp64():
    g = torch.Generator().manual_seed(3)
    reduced = (torch.randn(3_000_001, generator=g) * 2).bfloat16()
    exact = (reduced.double() * 0.5).square().sum().item()
    for epilogue in (cpu.reduce_epilogue, reference.reduce_epilogue):
        acc, sumsq = torch.empty(reduced.numel()), torch.zeros(1, dtype=torch.float64)
        epilogue(reduced, acc, torch.tensor([0.5]), False, sumsq, torch.zeros(1, dtype=torch.int32))
        assert sumsq.item() == pytest.approx(exact, rel=1e-13)  # an fp32 sum is off by ~1e-6 here


def test_the_cpu_kernel_clips_by_multiplying_the_gradient():
    """grad * coef, as the Triton kernel and DeepSpeed (`grad.mul_(1 / combined_scale)`) take it; fused Adam's
    grad_scale would divide by 1 / coef, an fp32 ulp off for about a tenth of the gradients."""
    g = torch.Generator().manual_seed(4)
    n, coef = 70_001, 0.7106257677078247  # several pieces of the kernel's clipped loop, and a ragged end
    param, grad = torch.randn(n, generator=g), torch.randn(n, generator=g).bfloat16().float()
    m, v = 0.1 * torch.randn(n, generator=g), 0.01 * torch.rand(n, generator=g)
    hyper = dict(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    got = [t.clone() for t in (param, m, v)]
    out = torch.empty(n, dtype=torch.bfloat16)
    f = lambda x: torch.tensor([x], dtype=torch.float32)  # noqa: E731
    cpu.adamw_step(got[0], grad, got[1], got[2], out, lr=f(0.01), step=f(5.0), coef=f(coef),
                   skip=torch.zeros(1, dtype=torch.int32), **hyper)
    want = [t.clone() for t in (param, m, v)]
    torch._fused_adamw_([want[0]], [grad * f(coef)], [want[1]], [want[2]], [], [f(5.0)], lr=float(f(0.01)),
                        amsgrad=False, maximize=False, grad_scale=None, found_inf=None, **hyper)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(out, got[0].bfloat16())

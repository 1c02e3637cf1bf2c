"""Does the fused AdamW kernel's 16-bit output equal torch's cast of the fp32 master it wrote (on this GPU)?"""
import torch

from zero_core.kernels import adamw_step

torch.manual_seed(0)
n = 10_000_019
for dtype in (torch.bfloat16, torch.float16):
    p = torch.randn(n, device="cuda") * 0.05
    g, m, v = torch.randn(n, device="cuda") * 1e-3, torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda")
    out = torch.empty(n, dtype=dtype, device="cuda")
    one = lambda x: torch.tensor([x], dtype=torch.float32, device="cuda")  # noqa: E731
    adamw_step(p, g, m, v, out, lr=one(1e-3), step=one(1.0), coef=one(1.0), skip=torch.zeros(1, dtype=torch.int32, device="cuda"),
               beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    ref = p.to(dtype)
    bad = (out.view(torch.int16) != ref.view(torch.int16)).nonzero().flatten()
    print(f"{dtype}: {bad.numel()} of {n} differ")
    for i in bad[:5].tolist():
        print(f"  fp32 {p[i].item()!r} ({p[i].view(torch.int32).item():#010x}) kernel {out[i].float().item()!r} torch {ref[i].float().item()!r}")
    x = torch.randn(n, device="cuda")
    print(f"  torch cast vs bit-exact RNE on random fp32: {(x.to(dtype).float() - x).abs().max().item():.3e} max error")

"""Does the fused AdamW kernel write the same fp32 master with and without its 16-bit output (HAS_OUT)?"""
import torch

from zero_core.kernels import adamw_step

torch.manual_seed(0)
n = 10_000_019
one = lambda x: torch.tensor([x], dtype=torch.float32, device="cuda")  # noqa: E731
p0 = torch.randn(n, device="cuda") * 0.05
g, m0, v0 = torch.randn(n, device="cuda") * 1e-3, torch.rand(n, device="cuda") * 1e-3, torch.rand(n, device="cuda") * 1e-6
masters = []
for dtype in (None, torch.bfloat16, torch.float16):
    p, m, v = p0.clone(), m0.clone(), v0.clone()
    out = None if dtype is None else torch.empty(n, dtype=dtype, device="cuda")
    adamw_step(p, g, m, v, out, lr=one(1e-3), step=one(3.0), coef=one(0.7), skip=torch.zeros(1, dtype=torch.int32, device="cuda"),
               beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    masters.append((dtype, p, m, v, out))
ref = masters[0]
for dtype, p, m, v, out in masters[1:]:
    print(f"out={dtype}: master differs at {(p != ref[1]).sum().item()} of {n}, exp_avg at {(m != ref[2]).sum().item()}, "
          f"exp_avg_sq at {(v != ref[3]).sum().item()}; out vs cast of own master: {(out != p.to(dtype)).sum().item()}; "
          f"out vs cast of the no-out master: {(out != ref[1].to(dtype)).sum().item()}")

"""GPU check of the streamed update (zero_core/optim/streamed_update.py): a host share of 40 Mi elements stepped
three times with half its chunks streamed through the device kernel, against the host step alone, lazy (gradient
from staging) and accumulated, with clipping off and engaged. Prints the largest difference over the largest
value (the device kernel's rounding, not bitwise) and whether the host's own chunks are bitwise the same; exits 1
past 1e-5 or where they are not.

Usage (repo root, one GPU): python3 docs/benchmarks/scripts/streamed_update_check.py
"""

from __future__ import annotations

import sys

import torch

from zero_core.optim import HostAdamW, Hyper
from zero_core.optim.states import TensorStates

N = 40 << 20


def run(fraction: float, clip: float, micro: int) -> tuple[TensorStates, torch.Tensor, torch.Tensor]:
    states = TensorStates(N, torch.device("cpu"))
    states.master.copy_(torch.randn(N, generator=torch.Generator().manual_seed(3)))
    opt = HostAdamW(states, comm_dtype=torch.float16, clip=clip, stream_fraction=fraction,
                    groups=[Hyper(0.9, 0.95, 1e-8, 0.1)], decoupled=True, lr_at=lambda a: torch.full((1,), 1e-3),
                    shard_stats=False, comm_device=torch.device("cuda"))
    gen = torch.Generator().manual_seed(11)
    out = torch.zeros(N, dtype=torch.float16)
    for _ in range(3):
        for m in range(micro):
            g = torch.randn(N, generator=gen).half().cuda()
            opt.begin_pass(torch.ones(1, device="cuda"), accumulate=m > 0, final=m == micro - 1)
            opt.receive(g, 0)
            torch.cuda.synchronize()
            opt.end_pass()
        opt.step(out)
        torch.cuda.synchronize()
    opt.close()
    streamed = torch.zeros(N, dtype=torch.bool)
    for a, b in opt.streamed_ranges:
        streamed[a:b] = True
    return states, out, streamed


def main() -> int:
    worst = 0.0
    for clip in (0.0, 1e-3):
        for micro in (1, 2):
            ref, ref_out, _ = run(0.0, clip, micro)
            got, got_out, streamed = run(0.5, clip, micro)
            for name in ("master", "exp_avg", "exp_avg_sq"):
                a, b = getattr(ref, name), getattr(got, name)
                rel = float((a - b).abs().max() / a.abs().max())
                tail = bool(torch.equal(a[~streamed], b[~streamed]))  # the host's own chunks: bitwise
                print(f"clip {clip:g} micro {micro} {name}: max diff / max {rel:.2e}, host chunks equal {tail}")
                worst = max(worst, rel if tail else 1.0)
            print(f"  16-bit out: {int((ref_out != got_out).sum())} of {N} differ")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())

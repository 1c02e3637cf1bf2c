"""The host AdamW's share of one step, on the CPU alone: 64 Mi elements fed in 8 Mi shards as backward would feed
them, half of them updated during the pass (`overlap_host_update` 0.5) and the rest at the step, clipping at 1.0.
Prints the mean ms of the pass (receive + fold + speculative updates + the wait at its end) and of the step, over
steps 3-8. To compare two commits on one machine: `git worktree add /tmp/old OLD`, then
`PYTHONPATH=/tmp/old python docs/benchmarks/scripts/host_pass_bench.py` against the same without PYTHONPATH.

    python docs/benchmarks/scripts/host_pass_bench.py [--overlap F] [--grad-scale S]

--grad-scale 1e-5 (default) keeps the global norm under 1 so the speculated half is kept; 1e-3 makes clipping
engage every step, so the step redoes it.
"""

import argparse
import time

import torch

from zero_core.optim import HostAdamW, Hyper
from zero_core.optim.states import TensorStates

NUMEL, SHARD = 64 << 20, 8 << 20

parser = argparse.ArgumentParser()
parser.add_argument("--overlap", type=float, default=0.5)
parser.add_argument("--grad-scale", type=float, default=1e-5)
args = parser.parse_args()

states = TensorStates(NUMEL, torch.device("cpu"))
states.master.normal_()
opt = HostAdamW(states, comm_dtype=torch.float32, clip=1.0, overlap_fraction=args.overlap,
                groups=[Hyper(0.9, 0.95, 1e-8, 0.1)], decoupled=True, lr_at=lambda applied: torch.full((1,), 1e-4),
                shard_stats=False, comm_device=torch.device("cpu"))
grads = torch.randn(NUMEL) * args.grad_scale
weights16 = torch.empty(NUMEL, dtype=torch.bfloat16)
timed = []
for step in range(8):
    start = time.perf_counter()
    opt.begin_pass(torch.ones(1), accumulate=False, final=True)
    for lo in range(0, NUMEL, SHARD):
        opt.receive(grads[lo : lo + SHARD], lo)
    opt.end_pass()
    passed = time.perf_counter()
    opt.step(weights16)
    if step >= 2:
        timed.append((passed - start, time.perf_counter() - passed))
opt.close()
pass_ms, step_ms = (1e3 * sum(t[i] for t in timed) / len(timed) for i in (0, 1))
print(f"overlap {args.overlap}, grad scale {args.grad_scale:g}, {torch.get_num_threads()} threads: "
      f"pass {pass_ms:.1f} ms, step {step_ms:.1f} ms")

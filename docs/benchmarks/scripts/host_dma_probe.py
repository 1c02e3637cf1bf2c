"""Does the GPU's copy engine add host-memory bandwidth beside the host AdamW, or share it?

Offload is bound by the host's memory traffic (28 bytes per element for the fp16 AdamW step). If the 16 cores,
not the memory, set that bound, a share of the states could be streamed to the GPU over PCIe, updated there
and streamed back while the cores update the rest. This measures, on one GPU machine:

    host adamw            the engine's host step (HostAdamW._update, fp16 staging) over N elements
    stream update         states in pinned host memory, per chunk: H2D master/m/v + fp16 gradient, the fused
                          Triton AdamW on the GPU, D2H master/m/v + the fp16 weights (14 + 14 bytes per element)
    both                  the two at once, on separate elements (the stream runs on its own thread)

Usage (repo root, one GPU): python3 docs/benchmarks/scripts/host_dma_probe.py [--numel-mi 512] [--chunk-mi 16]
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from zero_core import comm
from zero_core.kernels import adamw_step
from zero_core.optim import Hyper
from zero_core.optim.host_adam import HostAdamW
from zero_core.optim.states import TensorStates


def host_optimizer(n: int) -> tuple[HostAdamW, torch.Tensor]:
    states = TensorStates(n, torch.device("cpu"))
    states.master.normal_()
    opt = HostAdamW(states, comm_dtype=torch.float16, groups=[Hyper(0.9, 0.999, 1e-8, 0.01)], decoupled=True,
                    clip=0.0, lr_at=lambda applied: torch.full((1,), 1e-4), shard_stats=False,
                    comm_device=torch.device("cpu"))
    opt.begin_pass(torch.ones(1), accumulate=False, final=True)
    opt.receive(torch.randn(n).half(), 0)
    opt.end_pass()
    return opt, comm.host_buffer(n, torch.float16, pin=False)


class Streamed:
    """States in pinned host memory, updated on the GPU chunk by chunk (double-buffered on two copy streams)."""

    def __init__(self, n: int, chunk: int) -> None:
        self.n, self.chunk = n, chunk
        pin = lambda dt: comm.host_buffer(n, dt, pin=True)  # noqa: E731
        self.host = {k: pin(torch.float32) for k in ("p", "m", "v")}
        self.host["p"].normal_()
        self.grad, self.out = pin(torch.float16), pin(torch.float16)
        self.grad.copy_(torch.randn(n))
        dev = lambda dt: [torch.empty(chunk, dtype=dt, device="cuda") for _ in range(2)]  # noqa: E731
        self.dev = {k: dev(torch.float32) for k in ("p", "m", "v")}
        self.dgrad, self.dout = dev(torch.float16), dev(torch.float16)
        self.h2d, self.d2h = torch.cuda.Stream(), torch.cuda.Stream()
        self.sc = dict(lr=torch.full((1,), 1e-4, device="cuda"), step=torch.full((1,), 3.0, device="cuda"),
                       coef=torch.ones(1, device="cuda"), skip=torch.zeros(1, dtype=torch.int32, device="cuda"))
        self.freed = [torch.cuda.Event() for _ in range(2)]

    def run(self) -> None:
        comp = torch.cuda.current_stream()
        for i, a in enumerate(range(0, self.n, self.chunk)):
            b, k = min(self.n, a + self.chunk), i % 2
            m = b - a
            with torch.cuda.stream(self.h2d):
                self.h2d.wait_event(self.freed[k])
                for name in ("p", "m", "v"):
                    self.dev[name][k][:m].copy_(self.host[name][a:b], non_blocking=True)
                self.dgrad[k][:m].copy_(self.grad[a:b], non_blocking=True)
            comp.wait_stream(self.h2d)
            g = self.dgrad[k][:m].float()
            adamw_step(self.dev["p"][k][:m], g, self.dev["m"][k][:m], self.dev["v"][k][:m], self.dout[k][:m],
                       beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, **self.sc)
            self.d2h.wait_stream(comp)
            with torch.cuda.stream(self.d2h):
                for name in ("p", "m", "v"):
                    self.host[name][a:b].copy_(self.dev[name][k][:m], non_blocking=True)
                self.out[a:b].copy_(self.dout[k][:m], non_blocking=True)
                self.freed[k].record()
        self.d2h.synchronize()


def timed(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--numel-mi", type=int, default=512)
    ap.add_argument("--chunk-mi", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    n, chunk = a.numel_mi << 20, a.chunk_mi << 20
    opt, out = host_optimizer(n)
    host = lambda: opt._update(torch.ones(1), out, None)  # noqa: E731
    streamed = Streamed(n, chunk)
    th = timed(host, a.reps)
    ts = timed(streamed.run, a.reps)
    print(f"threads {torch.get_num_threads()}, {n:,} elements each, chunk {chunk:,}")
    print(f"host adamw alone:    {th * 1e3:8.1f} ms  {n / th / 1e9:.2f} G el/s  {28 * n / th / 1e9:.1f} GB/s")
    print(f"stream update alone: {ts * 1e3:8.1f} ms  {n / ts / 1e9:.2f} G el/s  {14 * n / ts / 1e9:.1f} GB/s per way")
    for _ in range(2):
        done = {}
        t = threading.Thread(target=lambda: done.setdefault("s", timed(streamed.run, a.reps)))
        t0 = time.perf_counter()
        t.start()
        hb = timed(host, a.reps)
        t.join()
        wall = time.perf_counter() - t0
        sb = done["s"]
        print(f"both: host {hb * 1e3:.1f} ms ({n / hb / 1e9:.2f} G el/s), stream {sb * 1e3:.1f} ms "
              f"({n / sb / 1e9:.2f} G el/s); together {2 * n * (a.reps + 1) / wall / 1e9:.2f} G el/s over {wall:.2f} s")
    opt.close()


if __name__ == "__main__":
    main()

"""Host AdamW with and without the copies an exact speculative update needs, on this machine's cores.

    python docs/benchmarks/scripts/host_speculate_bench.py [--numel-mi 512] [--repeats 3]

Its buffers are allocated as the engine's are (zero_core/host_pages.py: 2 MiB pages where the host grants them);
ZERO_CORE_HUGE_PAGES=0 measures them on the kernel's default pages instead.

Rates are G elements/s over one partition of fp32 master and moments and a bf16 gradient staging buffer:
  stream copy      one fp32 copy (GB/s read+written; the bandwidth the others share)
  plain            the step's AdamW: per 4 Mi chunk, the gradient rebuilt from staging, then fused AdamW in place
  backup, then     the three states copied aside for the whole range first, then the plain update
  interleaved S    per S-element piece: copy the piece's states aside, then update it while it is in cache
  alt S            per piece: copy the states to a second buffer and update that copy (a double-buffered store,
                   where the old values stay where they were and the update lands in the other buffer)
"""

from __future__ import annotations

import argparse
import time

import torch

from zero_core.host_pages import empty_host

NAMES = ("master", "exp_avg", "exp_avg_sq")
HYPER = dict(lr=1e-4, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False,
             grad_scale=None, found_inf=None)


def adam(states: dict, staging: torch.Tensor, scratch: torch.Tensor, lo: int, hi: int, step: torch.Tensor) -> None:
    g = scratch[: hi - lo]
    g.copy_(staging[lo:hi])
    g.mul_(0.5)
    torch._fused_adamw_([states["master"][lo:hi]], [g], [states["exp_avg"][lo:hi]],
                        [states["exp_avg_sq"][lo:hi]], [], [step], **HYPER)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--numel-mi", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    n, chunk = a.numel_mi << 20, 4 << 20
    # the engine's buffers: on 2 MiB pages unless ZERO_CORE_HUGE_PAGES=0 (zero_core/host_pages.py)
    states = {k: empty_host(n, torch.float32).uniform_() for k in NAMES}
    other = {k: empty_host(n, torch.float32) for k in NAMES}
    staging = empty_host(n, torch.bfloat16).normal_()
    scratch = torch.empty(chunk)
    step = torch.tensor(1.0)
    print(f"threads {torch.get_num_threads()}, {a.numel_mi} Mi elements, torch {torch.__version__}")

    def timed(name: str, fn, bytes_per_elem: float | None = None) -> None:
        fn()  # warm (page faults on first touch)
        best = min(_time(fn) for _ in range(a.repeats))
        extra = f", {bytes_per_elem * n / best / 1e9:.1f} GB/s" if bytes_per_elem else ""
        print(f"{name:<22} {n / best / 1e9:6.3f} G elements/s{extra}", flush=True)

    timed("stream copy", lambda: other["master"].copy_(states["master"]), 8)

    def plain(piece: int = chunk) -> None:
        for lo in range(0, n, piece):
            adam(states, staging, scratch, lo, min(n, lo + piece), step)

    def backup_then() -> None:
        for k in NAMES:
            other[k].copy_(states[k])
        plain()

    def interleaved(piece: int, into_alt: bool) -> None:
        for lo in range(0, n, piece):
            hi = min(n, lo + piece)
            for k in NAMES:
                other[k][lo:hi].copy_(states[k][lo:hi])
            adam(other if into_alt else states, staging, scratch, lo, hi, step)

    timed("plain", plain)
    timed("backup, then", backup_then)
    for piece in (1 << 18, 1 << 20, 4 << 20):
        timed(f"interleaved {piece >> 10} Ki", lambda p=piece: interleaved(p, False))
        timed(f"alt {piece >> 10} Ki", lambda p=piece: interleaved(p, True))


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()

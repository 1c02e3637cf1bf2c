"""The host side of optimizer offload against the host's memory bandwidth, measured in the same run.

    copy fp32 (host)      a STREAM-like copy: dst.copy_(src) on torch's thread pool, 8 bytes per element
                          (STREAM's convention: the read and the write, no write-allocate traffic)
    host adamw (offload)  the offload step as the engine runs it (optim/host_adam.py): a 16-bit reduced
                          gradient in staging, the fused CPU AdamW chunk by chunk, the 16-bit output
                          written while the chunk is in cache. DRAM traffic: master, exp_avg, exp_avg_sq
                          read and written (24 bytes), the 16-bit gradient read and the 16-bit output
                          written (2 x e16); the fp32 gradient rebuilt per chunk stays in cache.

Both are timed with perf_counter (median of a few calls after a warm-up); `pct_of_copy` is the share of
the host copy's GB/s (docs/engine.md says what limits it).
"""

from __future__ import annotations

import torch

from ..host_pages import empty_host
from .bench import _timer

# far larger than any last-level cache, small enough for a laptop: 2.5e8 fp32 elements are 1 GB per buffer
HOST_NUMEL_CAP = 250_000_000
_median_ms = _timer(torch.device("cpu"))


def _copy_ms(numel: int) -> float:
    src = empty_host(numel, torch.float32).normal_()  # the engine's kind of pages (host_pages.py)
    dst = empty_host(numel, torch.float32)
    return _median_ms(lambda: dst.copy_(src))


def _host_adamw_ms(numel: int, dtype16: torch.dtype) -> float:
    from ..optim import Hyper
    from ..optim.host_adam import HostAdamW
    from ..optim.states import TensorStates

    states = TensorStates(numel, torch.device("cpu"))
    states.master.normal_()
    opt = HostAdamW(
        states,
        comm_dtype=dtype16,
        groups=[Hyper(0.9, 0.999, 1e-8, 0.01)],
        decoupled=True,
        clip=0.0,
        lr_at=lambda applied: torch.full((1,), 1e-4),
        shard_stats=False,
        comm_device=torch.device("cpu"),
    )
    grad, out = torch.randn(numel).to(dtype16), empty_host(numel, dtype16)
    opt.begin_pass(torch.ones(1), accumulate=False, final=True)
    opt.receive(grad, 0)  # lands in staging; the statistics are taken once, outside the timing
    opt.end_pass()
    try:
        return _median_ms(lambda: opt._update(torch.ones(1), out, None))  # the update alone, as cpu_adam times it
    finally:
        opt.close()


def host_rows(numel: int, dtype16: torch.dtype = torch.bfloat16) -> list[dict]:
    """[copy fp32 (host), host adamw (offload)] with GB/s and the share of the host copy's bandwidth."""
    n = min(numel, HOST_NUMEL_CAP)
    e16 = torch.empty(0, dtype=dtype16).element_size()
    threads = torch.get_num_threads()
    rows = []
    for name, per_elem, ms in (
        ("copy fp32 (host)", 8, _copy_ms(n)),
        ("host adamw (offload)", 24 + 2 * e16, _host_adamw_ms(n, dtype16)),
    ):
        rows.append(
            {
                "name": name,
                "backend": f"cpu x{threads}",
                "ms": ms,
                "bytes": per_elem * n,
                "GB/s": per_elem * n / ms / 1e6,
            }
        )
    for r in rows:
        r["pct_of_copy"] = 100.0 * r["GB/s"] / rows[0]["GB/s"]
    return rows

"""Bandwidth benchmark of the two kernels against a plain copy and against the torch optimizer sequence.

Run: ``python -m zero_core.kernels.bench --numel 1e9`` (GPU) or ``--numel 1e6 --device cpu`` (smoke test,
torch reference backend, timed with perf_counter).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from . import adamw_step, backend_for, reduce_epilogue

OURS_PHASE = "ours: epilogue + norm + clip + adamw"
TORCH_PHASE = "torch: cast + clip_grad_norm_ + AdamW(fused) + copy"
_HP = dict(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
_MAX_NORM = 1.0
Timer = Callable[[Callable[[], object]], float]  # fn -> median ms of one call


def _timer(device: torch.device) -> Timer:
    """A function that returns the median milliseconds of one call of ``fn`` (after warm-up)."""
    if device.type == "cuda":
        import triton.testing

        return lambda fn: float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))

    def cpu_time(fn: Callable[[], object], reps: int = 5) -> float:
        fn()  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    return cpu_time


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _scalars(device: torch.device) -> dict[str, torch.Tensor]:
    f = lambda x: torch.tensor([x], dtype=torch.float32, device=device)  # noqa: E731
    return dict(lr=f(1e-4), step=f(10.0), coef=f(1.0), skip=torch.zeros(1, dtype=torch.int32, device=device))


def _adam_buffers(numel: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """param, exp_avg, exp_avg_sq with random (not zero) data; v must be >= 0."""
    return (torch.randn(numel, device=device), 0.1 * torch.randn(numel, device=device),
            0.01 * torch.rand(numel, device=device))


def _bench_copy(numel: int, device: torch.device, timeit: Timer) -> float:
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    return timeit(lambda: dst.copy_(src))


def _bench_adamw(numel: int, dtype16: torch.dtype, device: torch.device, timeit: Timer) -> float:
    p, m, v = _adam_buffers(numel, device)
    g = torch.randn(numel, device=device)
    out = torch.empty(numel, dtype=dtype16, device=device)
    sc = _scalars(device)
    return timeit(lambda: adamw_step(p, g, m, v, out, **sc, **_HP))


def _bench_adamw_groups(numel: int, dtype16: torch.dtype, device: torch.device, timeit: Timer) -> float:
    """The update of a partition holding two optimizer groups (weights with decay, 95%; biases and norms
    without, 5%): one launch per group run, each with its own lr tensor and hyper-parameters."""
    p, m, v = _adam_buffers(numel, device)
    g = torch.randn(numel, device=device)
    out = torch.empty(numel, dtype=dtype16, device=device)
    sc = _scalars(device)
    lrs = torch.tensor([1e-4, 2e-4], device=device)
    cut = numel * 95 // 100 // 64 * 64
    runs = [(0, cut, 0, 0.01), (cut, numel, 1, 0.0)]

    def update() -> None:
        for lo, hi, grp, wd in runs:
            adamw_step(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], out[lo:hi], lr=lrs[grp : grp + 1], step=sc["step"],
                       coef=sc["coef"], skip=sc["skip"], beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=wd)

    return timeit(update)


def _bench_epilogue(
    numel: int, dtype16: torch.dtype, accumulate: bool, device: torch.device, timeit: Timer
) -> float:
    reduced = torch.randn(numel, device=device).to(dtype16)
    acc = torch.randn(numel, device=device)
    scale = torch.full((1,), 0.5, device=device)
    sumsq = torch.zeros(1, device=device)
    nonfinite = torch.zeros(1, dtype=torch.int32, device=device)
    return timeit(lambda: reduce_epilogue(reduced, acc, scale, accumulate, sumsq, nonfinite))


def _bench_ours_phase(numel: int, dtype16: torch.dtype, device: torch.device, timeit: Timer) -> float:
    reduced = torch.randn(numel, device=device).to(dtype16)  # the reduce-scatter output
    acc = torch.empty(numel, device=device)  # fp32 grad partition
    p, m, v = _adam_buffers(numel, device)
    out = torch.empty(numel, dtype=dtype16, device=device)
    sc = _scalars(device)
    scale, sumsq = torch.full((1,), 0.5, device=device), torch.zeros(1, device=device)
    nonfinite = sc.pop("skip")  # the overflow flag is the skip flag: no host round trip

    def phase() -> None:
        sumsq.zero_()
        nonfinite.zero_()
        reduce_epilogue(reduced, acc, scale, False, sumsq, nonfinite)
        coef = (_MAX_NORM / (sumsq.sqrt() + 1e-6)).clamp_(max=1.0)
        sc["coef"] = coef
        adamw_step(p, acc, m, v, out, skip=nonfinite, **sc, **_HP)

    return timeit(phase)


def _bench_torch_phase(numel: int, dtype16: torch.dtype, device: torch.device, timeit: Timer) -> float:
    param = torch.nn.Parameter(torch.randn(numel, device=device))
    param.grad = torch.empty(numel, device=device)
    grad16 = torch.randn(numel, device=device).to(dtype16)
    out = torch.empty(numel, dtype=dtype16, device=device)
    hp = dict(lr=1e-4, betas=(_HP["beta1"], _HP["beta2"]), eps=_HP["eps"], weight_decay=_HP["weight_decay"])
    try:
        opt = torch.optim.AdamW([param], fused=True, **hp)
    except RuntimeError:  # fused unsupported on this device/build
        opt = torch.optim.AdamW([param], **hp)

    @torch.no_grad()
    def phase() -> None:
        param.grad.copy_(grad16)
        torch.nn.utils.clip_grad_norm_([param], _MAX_NORM)
        opt.step()
        out.copy_(param)

    phase()  # creates the optimizer state outside the timing
    return timeit(phase)


def bench_kernels(numel: int = 1_000_000_000, dtype16: torch.dtype = torch.bfloat16,
                  device: str = "cuda", host: bool = True) -> list[dict]:
    """Time copy, adamw_step, reduce_epilogue and the whole optimizer phase (ours vs torch) on ``numel``, and
    (`host`) the offload step's host AdamW against the host's copy bandwidth.

    Returns one dict per row: name, backend, ms, bytes (counted traffic), GB/s, pct_of_copy (of the copy row
    of the same memory: the device's, or the host's for the host rows).
    """
    dev = torch.device(device)
    timeit = _timer(dev)
    e16 = torch.empty(0, dtype=dtype16).element_size()
    backend = backend_for(torch.empty(0, device=dev))
    # (name, backend, bytes per element, runner); every runner frees its buffers on return
    cases = [
        ("copy fp32 (d2d)", "torch", 8, lambda: _bench_copy(numel, dev, timeit)),
        ("adamw_step", backend, 28 + e16, lambda: _bench_adamw(numel, dtype16, dev, timeit)),
        ("adamw_step, 2 groups", backend, 28 + e16, lambda: _bench_adamw_groups(numel, dtype16, dev, timeit)),
        ("reduce_epilogue", backend, e16 + 4, lambda: _bench_epilogue(numel, dtype16, False, dev, timeit)),
        ("reduce_epilogue accumulate", backend, e16 + 8,
         lambda: _bench_epilogue(numel, dtype16, True, dev, timeit)),
        (OURS_PHASE, backend, (e16 + 4) + (28 + e16), lambda: _bench_ours_phase(numel, dtype16, dev, timeit)),
        # cast (e16 + 4) + norm (4) + clip mul (8) + AdamW (28) + copy to 16-bit (4 + e16)
        (TORCH_PHASE, "torch", 48 + 2 * e16, lambda: _bench_torch_phase(numel, dtype16, dev, timeit)),
    ]
    rows: list[dict] = []
    for name, be, per_elem, run in cases:
        ms = run()
        _free(dev)
        nbytes = per_elem * numel
        rows.append({"name": name, "backend": be, "ms": ms, "bytes": nbytes, "GB/s": nbytes / ms / 1e6})
    copy_gbs = rows[0]["GB/s"]
    for r in rows:
        r["pct_of_copy"] = 100.0 * r["GB/s"] / copy_gbs
    if host:  # optimizer offload's update against the host's own copy bandwidth (host_bench.py)
        from .host_bench import host_rows

        rows += host_rows(numel, dtype16)
    return rows


def phase_ratio(rows: list[dict]) -> float:
    """Time of our optimizer phase divided by the torch sequence's (< 1: ours is faster)."""
    ms = {r["name"]: r["ms"] for r in rows}
    return ms[OURS_PHASE] / ms[TORCH_PHASE]


def format_rows(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    cols = list(rows[0])
    fmt = {"ms": "{:.3f}", "bytes": "{:.3e}", "GB/s": "{:.1f}", "pct_of_copy": "{:.1f}"}
    cells = [[fmt.get(c, "{}").format(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths]), *map(line, cells)])


def main() -> None:
    """CLI entry: print versions, the device, the table and the ours/torch phase ratio."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--numel", type=lambda s: int(float(s)), default=1_000_000_000)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dtype16 = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    name = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}, triton {triton_version}, device {name}, numel {a.numel:.3g}, {a.dtype}")
    rows = bench_kernels(a.numel, dtype16, a.device)
    print(format_rows(rows))
    print(f"optimizer phase, ours / torch time: {phase_ratio(rows):.3f}")


if __name__ == "__main__":
    main()

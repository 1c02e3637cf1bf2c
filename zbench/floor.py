"""The physical floor of a training step, measured on one device: what no engine can beat.

Forward + backward of the scenario's model and batch with 16-bit (working-precision) weights, no
optimizer and no communication, plus zero_core's fused optimizer phase (reduce epilogue + AdamW with
the 16-bit copy) over one rank's share of the parameters. A variant's step time divided by this sum is
its distance from the limit (the targets are <= 1.05x at ZeRO-2, <= 1.10x at ZeRO-3).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from zero_core.kernels import adamw_step, reduce_epilogue

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _timed(fn: Callable[[], None], device: torch.device, warmup: int, repeats: int) -> float:
    """Mean seconds per call of `fn` after `warmup` untimed calls."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats


def forward_backward_seconds(
    model: torch.nn.Module,
    call: Callable[[Any, dict], Any],
    batch: dict[str, torch.Tensor],
    device: torch.device,
    warmup: int = 2,
    repeats: int = 5,
) -> float:
    """Seconds per forward+backward of `batch` (gradients dropped each time, as an engine's hooks do)."""
    params = [p for p in model.parameters() if p.requires_grad]

    def fwd_bwd() -> None:
        call(model, batch).loss.backward()
        for p in params:
            p.grad = None

    return _timed(fwd_bwd, device, warmup, repeats)


def optimizer_phase_seconds(
    numel: int, dtype: torch.dtype, device: torch.device, warmup: int = 2, repeats: int = 5
) -> float:
    """Seconds of the fused optimizer phase over a `numel`-element fp32 partition with a 16-bit copy."""
    f32 = dict(dtype=torch.float32, device=device)
    master, exp_avg, exp_avg_sq, grad = (torch.rand(numel, **f32) for _ in range(4))
    reduced = torch.rand(numel, dtype=dtype, device=device)
    out = torch.empty(numel, dtype=dtype, device=device)
    one, sumsq = torch.ones(1, **f32), torch.zeros(1, **f32)
    nonfinite, skip = (torch.zeros(1, dtype=torch.int32, device=device) for _ in range(2))
    lr, step = torch.full((1,), 1e-4, **f32), torch.ones(1, **f32)

    def phase() -> None:
        reduce_epilogue(reduced, grad, one, False, sumsq, nonfinite)
        adamw_step(
            master,
            grad,
            exp_avg,
            exp_avg_sq,
            out,
            lr=lr,
            step=step,
            coef=one,
            skip=skip,
            beta1=0.9,
            beta2=0.999,
            eps=1e-8,
            weight_decay=0.0,
        )

    return _timed(phase, device, warmup, repeats)


def measure(
    bundle: Any, batch: dict[str, torch.Tensor], precision: str, world_size: int, device: torch.device
) -> dict[str, float]:
    """The floor for one rank of a `world_size`-rank run: {fwd_bwd_ms, optimizer_ms, shard_numel}."""
    dtype = DTYPES[precision]
    model = bundle.model.to(device=device, dtype=dtype)
    fwd_bwd = forward_backward_seconds(model, bundle.call, batch, device)
    model.to("cpu")  # the optimizer phase gets the device memory to itself
    shard = -(-bundle.n_params // world_size)
    opt = optimizer_phase_seconds(shard, dtype, device)
    return {"fwd_bwd_ms": fwd_bwd * 1e3, "optimizer_ms": opt * 1e3, "shard_numel": float(shard)}

"""Where a zero_core step's time goes: busy time per CUDA stream and idle gaps on the compute stream.

    torchrun --nproc-per-node 2 docs/benchmarks/scripts/profile_step.py \
        --config docs/benchmarks/scripts/gpt2xl_stage2.json

Rank 0 profiles `--steps` steps after `--warmup` with torch.profiler and prints the step time, the
kernels that take the most time, each stream's busy time, and the compute stream's idle time inside
the profiled window (host gaps and waits on communication are what stand between us and the floor).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
import torch.distributed as dist

import zero_core
from zbench.models.gpt import GPT
from zbench.train_demo import preset_config
from zbench.variants.zero import with_overlapped_weight_gather


def merged_busy(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--model", default="gpt2-xl")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    with open(args.config) as f:
        cfg = json.load(f)
    torch.manual_seed(0)
    engine = zero_core.initialize(GPT(preset_config(args.model)), with_overlapped_weight_gather(cfg))  # as zbench run
    micro = engine.config.train_micro_batch_size_per_gpu
    vocab = preset_config(args.model).vocab_size
    x = torch.randint(0, vocab, (micro, args.seq_len), device=engine.device)
    y = torch.randint(0, vocab, (micro, args.seq_len), device=engine.device)

    def step() -> None:
        engine.backward(engine(x, y).loss)
        engine.step()

    cuda = engine.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    plain_ms = (time.perf_counter() - t0) / args.steps * 1e3
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(args.steps):
            step()
        sync()
    if engine.rank != 0 or not cuda:
        print(f"rank {engine.rank}: step {plain_ms:.1f} ms" + ("" if cuda else " (CPU: no kernel breakdown)"))
        dist.barrier()
        return
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_stream: dict[int, list[tuple[float, float]]] = defaultdict(list)
    by_name: dict[str, float] = defaultdict(float)
    for k in kernels:
        start, end = k.time_range.start, k.time_range.end
        per_stream[getattr(k, "device_resource_id", 0)].append((start, end))
        by_name[k.name[:90]] += (end - start) / 1e3
    window = (
        max(e for v in per_stream.values() for _, e in v) - min(s for v in per_stream.values() for s, _ in v)
    ) / 1e3
    print(f"step {plain_ms:.1f} ms without the profiler; profiled window {window / args.steps:.1f} ms/step")
    print("stream busy ms/step (largest first):")
    busiest = sorted(per_stream.items(), key=lambda kv: -merged_busy(kv[1]))
    for sid, iv in busiest:
        print(f"  stream {sid}: {merged_busy(iv) / 1e3 / args.steps:.1f}  ({len(iv) // args.steps} kernels/step)")
    compute = busiest[0][1]
    idle = window - merged_busy(compute) / 1e3
    print(f"compute stream idle: {idle / args.steps:.1f} ms/step")
    print(f"top {args.top} kernels, ms/step:")
    for name, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {ms / args.steps:8.2f}  {name}")
    dist.barrier()


if __name__ == "__main__":
    main()

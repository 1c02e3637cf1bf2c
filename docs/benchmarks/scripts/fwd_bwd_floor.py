"""Compute floor for engine-overhead ratios: forward+backward alone on one GPU, bf16 weights, no optimizer.

    python docs/benchmarks/scripts/fwd_bwd_floor.py --model gpt2-xl --micro-batch 8 --seq-len 1024
"""

from __future__ import annotations

import argparse
import statistics

import torch

from zbench.train_demo import preset_config
from zbench.models.gpt import GPT


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-xl")  # a name in zbench/model_configs/
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    cfg = preset_config(args.model)
    model = GPT(cfg).cuda().to(torch.bfloat16)
    x = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq_len + 1), device="cuda")
    times = []
    for i in range(args.steps + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(x[:, :-1], x[:, 1:]).loss.backward()
        end.record()
        torch.cuda.synchronize()
        for p in model.parameters():
            p.grad = None
        if i >= 3:
            times.append(start.elapsed_time(end))
    ms = statistics.median(times)
    n = sum(p.numel() for p in model.parameters())
    tokens = args.micro_batch * args.seq_len
    flops = tokens * (6 * n + 12 * cfg.n_layer * cfg.n_embd * args.seq_len)
    print(f"floor: {args.model} micro-batch {args.micro_batch} seq {args.seq_len}: fwd+bwd {ms:.1f} ms, "
          f"{flops / ms / 1e9:.0f} TFLOP/s, {tokens / ms * 1e3:.0f} tokens/s per GPU")


if __name__ == "__main__":
    main()

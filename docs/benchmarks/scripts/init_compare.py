"""Sharded initialisation, zero_core against DeepSpeed's zero.Init, on any machine (CPU ranks on gloo too).

Each rank builds zbench's GPT under `zero_core.init_context` (or `deepspeed.zero.Init`, or eagerly: the whole
model on every rank, then initialize), hands it to its engine's initialize at stage 3, and prints one JSON line:
seconds and the rank's peak host memory (VmHWM) once the model is built, and again once the engine is initialised
(which adds the optimizer's states), and the rank's parameter bytes.
No training step (on a CPU DeepSpeed's offload optimizer needs its C++ build).
  DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 docs/benchmarks/scripts/init_compare.py --engine deepspeed
On a GPU: torchrun --nproc-per-node 1 docs/benchmarks/scripts/init_compare.py --engine zero --n-layer 32 --n-embd 2560
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from zbench.host_memory import peak_rss_bytes
from zbench.models.gpt import GPT, GPTConfig


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=["zero", "deepspeed", "eager"], default="zero")
    p.add_argument("--n-layer", type=int, default=24)
    p.add_argument("--n-embd", type=int, default=2048)
    args = p.parse_args()
    cfg = GPTConfig(vocab_size=50304, block_size=1024, n_layer=args.n_layer, n_head=16, n_embd=args.n_embd)
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    torch.manual_seed(0)
    start = time.perf_counter()
    if args.engine == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
        with deepspeed.zero.Init(config_dict_or_path=ds):
            model = GPT(cfg)
        built = _synced() - start, peak_rss_bytes()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
        shard = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in model.parameters())
    else:
        import zero_core

        if args.engine == "zero":
            with zero_core.init_context(ds):
                model = GPT(cfg)
        else:
            model = GPT(cfg)
        built = _synced() - start, peak_rss_bytes()
        engine = zero_core.initialize(model, ds)
        shard = None
    seconds = _synced() - start
    print(json.dumps({
        "engine": args.engine, "rank": dist.get_rank() if dist.is_initialized() else 0,
        "world": dist.get_world_size() if dist.is_initialized() else 1,
        "params_b": round(cfg.num_params() / 1e9, 3),
        "built_s": round(built[0], 2), "built_peak_host_gib": round(built[1] / 2**30, 2), "init_s": round(seconds, 2),
        "peak_host_gib": round(peak_rss_bytes() / 2**30, 2),
        "fp32_full_model_gib": round(cfg.num_params() * 4 / 2**30, 2),
        "deepspeed_param_shard_gib": None if shard is None else round(shard / 2**30, 2),
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
    }), flush=True)
    del engine


def _synced() -> float:
    """perf_counter once the GPU has done what was queued (initialisation runs kernels asynchronously)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


if __name__ == "__main__":
    main()

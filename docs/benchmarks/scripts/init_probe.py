"""One try of the largest-model search on one GPU: build a GPT sharded, initialise, train a few steps.

Prints one JSON line: parameters, initialisation seconds (construction + initialize), peak host memory
(the process's own high-water mark, VmHWM: ru_maxrss would carry the launcher's size across exec), GPU
peak, ms/step and TFLOP/s (6N + 12 L d T per token, model FLOPs).
`--engine deepspeed` builds under DeepSpeed's own zero.Init and trains with deepspeed.initialize.
Run by largest_model.sh; by hand: torchrun --nproc-per-node 1 docs/benchmarks/scripts/init_probe.py --n-layer 38
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from zbench.host_memory import peak_rss_bytes
from zbench.models.gpt import GPT, GPTConfig


def ds_config(args: argparse.Namespace) -> dict:
    zero: dict = {
        "stage": 3,
        "offload_optimizer": {"device": args.offload_optimizer, "pin_memory": True},
        "stage3_param_persistence_threshold": 0,
    }
    if args.offload_param != "none":
        zero["offload_param"] = {"device": args.offload_param, "pin_memory": True}
    for key in ("offload_optimizer", "offload_param"):
        if zero.get(key, {}).get("device") == "nvme":
            zero[key]["nvme_path"] = args.nvme_path
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": zero,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n-layer", type=int, required=True)
    p.add_argument("--n-embd", type=int, default=5120)
    p.add_argument("--n-head", type=int, default=40)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--engine", choices=["zero", "deepspeed"], default="zero")
    p.add_argument("--offload-optimizer", choices=["cpu", "nvme"], default="cpu")
    p.add_argument("--offload-param", choices=["none", "cpu", "nvme"], default="cpu")
    p.add_argument("--nvme-path", default="/tmp/zb_nvme")
    args = p.parse_args()
    cfg = GPTConfig(
        vocab_size=50304, block_size=args.seq_len, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd
    )
    ds = ds_config(args)
    torch.manual_seed(0)
    start = time.perf_counter()
    if args.engine == "zero":
        import zero_core

        with zero_core.init_context(ds):
            model = GPT(cfg)
        model.gradient_checkpointing_enable()
        engine = zero_core.initialize(model, ds)
    else:
        import deepspeed

        deepspeed.init_distributed()
        with deepspeed.zero.Init(config_dict_or_path=ds):
            model = GPT(cfg)
        model.gradient_checkpointing_enable()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    torch.cuda.synchronize()
    init_s = time.perf_counter() - start
    init_host = peak_rss_bytes() / 2**30
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq_len), device=device)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = engine(x, x).loss
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    steady = sorted(times[1:] or times)[len(times[1:] or times) // 2]  # median past the first step
    n = cfg.num_params()
    tokens = args.micro_batch * args.seq_len
    flops = tokens * (6 * n + 12 * cfg.n_layer * cfg.n_embd * args.seq_len)
    print(
        json.dumps(
            {
                "engine": args.engine,
                "n_layer": args.n_layer,
                "n_embd": args.n_embd,
                "params_b": round(n / 1e9, 3),
                "offload_param": args.offload_param,
                "offload_optimizer": args.offload_optimizer,
                "init_s": round(init_s, 1),
                "init_peak_host_gib": round(init_host, 2),
                "peak_host_gib": round(peak_rss_bytes() / 2**30, 2),
                "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                "ms_per_step": round(steady * 1e3),
                "tflops": round(flops / steady / 1e12, 1),
                "loss": float(loss.detach()),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

"""Make a zbench checkpoint of a >= 1 GB (fp32) model for the converter memory benchmark.

torchrun --nproc-per-node 2 docs/benchmarks/scripts/make_big_checkpoint.py --model gpt2-medium --out /tmp/big_ckpt
"""

from __future__ import annotations

import argparse

import torch

import zero_core
from zbench.models.gpt import GPT
from zbench.train_demo import preset_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-medium")  # a name in zbench/model_configs/
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = preset_config(args.model)
    engine = zero_core.initialize(
        GPT(cfg), {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": args.stage}}
    )
    x = torch.randint(0, cfg.vocab_size, (1, 17))
    engine.backward(engine(x[:, :-1], x[:, 1:]).loss)
    engine.step()
    path = engine.save_checkpoint(args.out)
    if engine.rank == 0:
        print(f"saved {path}: {engine.layout.numel:,} trainable params")


if __name__ == "__main__":
    main()

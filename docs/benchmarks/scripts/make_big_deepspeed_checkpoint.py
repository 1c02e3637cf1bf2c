"""A real DeepSpeed ZeRO-2 (or --stage 3) checkpoint of a GPT for the converter benchmarks (CPU ranks).

DS_ACCELERATOR=cpu deepspeed --num_gpus 2 docs/benchmarks/scripts/make_big_deepspeed_checkpoint.py --out /tmp/ds_big
DS_ACCELERATOR=cpu deepspeed --num_gpus 2 docs/benchmarks/scripts/make_big_deepspeed_checkpoint.py \
    --model gpt2 --stage 3 --out /tmp/ds_z3
"""

from __future__ import annotations

import argparse

import torch

from zbench.models.gpt import GPT
from zbench.train_demo import preset_config


def main() -> None:
    import deepspeed

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-medium")  # a name in zbench/model_configs/
    ap.add_argument("--out", required=True)
    ap.add_argument("--stage", type=int, default=2, choices=(1, 2, 3))
    ap.add_argument("--local_rank", type=int, default=0)
    args = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    cfg = preset_config(args.model)
    model = GPT(cfg)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": args.stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randint(0, cfg.vocab_size, (1, 17))
    engine.backward(engine(x[:, :-1], x[:, 1:]).loss)
    engine.step()
    engine.save_checkpoint(args.out)


if __name__ == "__main__":
    main()

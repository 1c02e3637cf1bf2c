"""DeBERTa/MRPC in Hugging Face Trainer form: ZeroTrainer against DeepSpeed's Trainer integration, same config, batch.

What it does: builds a random-init deberta-v3-base (DebertaV2Config in code; no hub) for sequence
classification, MRPC-like synthetic sentence pairs (seq 128, 2 labels; `--data-seed`), and trains it with
`transformers.Trainer` (`--engine deepspeed`: TrainingArguments(deepspeed=CONFIG), real DeepSpeed) or
`zero_core.integrations.transformers.ZeroTrainer` (`--engine zero_core`: the same CONFIG). The script is the
same but for that import. It prints one JSON line from rank 0: tokens/s over the steps after `--warmup`
(padded tokens, all ranks), ms/step, peak GPU memory (max over ranks) and the last logged loss.

How to run (one GPU, the DeepSpeed venv for the reference; the main env has zero_core):
    torchrun --nproc_per_node 1 docs/benchmarks/scripts/deberta_trainer.py --engine zero_core --config CONFIG
    torchrun --nproc_per_node 1 docs/benchmarks/scripts/deberta_trainer.py --engine deepspeed --config CONFIG
CONFIG defaults to tests/data/seed_configs/001_kaggle_longformer_ds_config_dict.json (stage 2, optimizer
offload, "auto" values); bf16 with --bf16 (the config's fp16 "auto" then stays off).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import transformers

REPO = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG = REPO / "tests" / "data" / "seed_configs" / "001_kaggle_longformer_ds_config_dict.json"


class Pairs(torch.utils.data.Dataset):
    """MRPC-shaped data: [CLS] a [SEP] b [SEP] token ids, token types, a label that depends on the pair."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, vocab, (n, seq), generator=g)
        self.ids[:, 0], self.ids[:, seq // 2], self.ids[:, -1] = 1, 2, 2
        self.types = torch.zeros(n, seq, dtype=torch.long)
        self.types[:, seq // 2 + 1 :] = 1
        self.labels = (self.ids[:, 1] % 2 == self.ids[:, seq // 2 + 1] % 2).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.ids[i],
            "token_type_ids": self.types[i],
            "labels": self.labels[i],
            "attention_mask": torch.ones_like(self.ids[i]),
        }


class Clock(transformers.TrainerCallback):
    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.steps = warmup, None, 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.warmup:
            torch.cuda.synchronize()
            self.start = time.perf_counter()
            torch.cuda.reset_peak_memory_stats()
        elif state.global_step > self.warmup:
            self.steps += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["zero_core", "deepspeed"], required=True)
    p.add_argument("--config", default=str(DEFAULT_CONFIG))
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--out", default="/tmp/deberta_trainer")
    a = p.parse_args()
    if a.engine == "zero_core":
        from zero_core.integrations.transformers import Trainer, TrainingArguments
    else:
        from transformers import Trainer, TrainingArguments
    cfg = transformers.DebertaV2Config(
        vocab_size=128100,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
        relative_attention=True,
        position_buckets=256,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        pos_att_type=["p2c", "c2p"],
        layer_norm_eps=1e-7,
        max_relative_positions=-1,
        position_biased_input=False,
        type_vocab_size=0,
        num_labels=2,
    )
    torch.manual_seed(0)
    model = transformers.DebertaV2ForSequenceClassification(cfg)
    args = TrainingArguments(
        output_dir=a.out,
        deepspeed=a.config,
        per_device_train_batch_size=a.micro_batch,
        learning_rate=2e-5,
        weight_decay=0.01,
        warmup_steps=a.warmup,
        max_steps=a.steps,
        bf16=a.bf16,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_drop_last=True,
        seed=0,
    )
    clock = Clock(a.warmup)
    data = Pairs(a.micro_batch * a.steps * max(1, args.world_size), a.seq, cfg.vocab_size, a.data_seed)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[clock])
    trainer.train()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - clock.start
    peak = torch.tensor([torch.cuda.max_memory_allocated()], device="cuda")
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
    if args.process_index == 0:
        tokens = clock.steps * a.micro_batch * a.seq * args.world_size
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        print(
            json.dumps(
                {
                    "engine": a.engine,
                    "config": Path(a.config).name,
                    "world": args.world_size,
                    "micro_batch": a.micro_batch,
                    "seq": a.seq,
                    "bf16": a.bf16,
                    "steps_timed": clock.steps,
                    "tokens_per_s": round(tokens / seconds, 1),
                    "ms_per_step": round(1e3 * seconds / clock.steps, 2),
                    "peak_gib": round(float(peak) / 2**30, 3),
                    "last_loss": losses[-1] if losses else None,
                }
            )
        )


if __name__ == "__main__":
    main()

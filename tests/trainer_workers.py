"""Hugging Face Trainer runs for tests/test_integration_transformers.py (a helper module, not a test module):
the same tiny GPT-2 or BERT, data and arguments under `transformers.Trainer` (torch DDP over gloo) or
`ZeroTrainer` with a seed DeepSpeed config verbatim.

The data order is sequential, so that 2 ranks of batch b and 1 rank of batch 2b see the same global batches
(a resume on another world size continues the same curve). Dropout is off. Every micro-step's loss is recorded
as Trainer's `training_step` returns it; `global_losses` averages it over the ranks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.distributed as dist

SEEDS = Path(__file__).parent / "data" / "seed_configs"
VOCAB, SEQ, SAMPLES, LR, WARMUP, GLOBAL_MICRO, GAS = 64, 8, 32, 1e-2, 3, 4, 2


def tiny_model(kind: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=VOCAB,
            n_positions=SEQ,
            n_embd=32,
            n_layer=2,
            n_head=2,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForSequenceClassification(cfg)


class Samples(torch.utils.data.Dataset):
    def __init__(self, kind: str, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.labels = self.ids.clone() if kind == "gpt2" else torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def zero3_auto_config(schedule: str) -> dict:
    """Stage 3 with every value "auto", for Trainer to fill, and torch's Adam (DeepSpeed on the CPU); with schedule
    "config" the config's WarmupDecayLR too, else Trainer's own schedule."""
    cfg: dict = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                 "gradient_clipping": "auto", "zero_optimization": {"stage": 3},
                 "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                           "weight_decay": "auto", "torch_adam": True}}}
    if schedule == "config":
        cfg["scheduler"] = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                                "warmup_num_steps": "auto", "total_num_steps": "auto"}}
    return cfg


def recording(base: type, config_schedule: bool = False, config_optimizer: bool = False) -> type:
    """`base` with a sequential data order and recorded losses; with `config_schedule` (the DDP reference of a
    config with a "scheduler" section) the seed configs' WarmupLR as its torch schedule; with `config_optimizer`
    (of a config with an "optimizer" section) AdamW over every trainable parameter in one group, weight decay
    on all, as transformers hands them to DeepSpeed."""

    class Recording(base):
        losses: list[float]

        def create_optimizer(self, model=None):
            if not config_optimizer or self.optimizer is not None:
                return super().create_optimizer(model)
            a = self.args
            params = [p for p in (model or self.model).parameters() if p.requires_grad]
            self.optimizer = torch.optim.AdamW(params, lr=a.learning_rate, betas=(a.adam_beta1, a.adam_beta2),
                                               eps=a.adam_epsilon, weight_decay=a.weight_decay)
            return self.optimizer

        def create_scheduler(self, num_training_steps, optimizer=None):
            if not config_schedule or self.lr_scheduler is not None:
                return super().create_scheduler(num_training_steps, optimizer)
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, warmup_lr_factor)
            self._created_lr_scheduler = True
            return self.lr_scheduler

        def _get_train_sampler(self, train_dataset=None):
            return torch.utils.data.SequentialSampler(train_dataset or self.train_dataset)

        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.losses = getattr(self, "losses", []) + [float(loss)]
            return loss

    return Recording


def warmup_lr_factor(step: int) -> float:
    """The seed configs' WarmupLR with its "auto" values filled (min 0, max LR, warmup WARMUP), over LR, for
    the DDP reference (zero_core's formula, checked against DeepSpeed's class in tests/test_lr_schedules.py)."""
    import zero_core
    from zero_core.lr_schedules import make_lr_schedule

    cfg = zero_core.load_config(
        {
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": LR}},
            "scheduler": {
                "type": "WarmupLR",
                "params": {"warmup_min_lr": 0, "warmup_max_lr": LR, "warmup_num_steps": WARMUP},
            },
        },
        1,
    )
    return float(make_lr_schedule(cfg)(torch.tensor(float(step)))[0]) / LR


def arguments(cls: type, out: str, world: int, seed_config: str | None, **extra) -> object:
    kwargs = dict(
        output_dir=out,
        per_device_train_batch_size=GLOBAL_MICRO // world,
        gradient_accumulation_steps=GAS,
        per_device_eval_batch_size=4,
        learning_rate=LR,
        weight_decay=0.1,
        warmup_steps=WARMUP,
        num_train_epochs=2,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="steps",
        eval_steps=4,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        seed=0,
        disable_tqdm=True,
        max_grad_norm=1.0,
    )
    kwargs.update(extra)
    if seed_config is not None:
        kwargs["deepspeed"] = str(SEEDS / seed_config)
    return cls(**kwargs)


def run(
    rank: int,
    world: int,
    mode: str,
    kind: str,
    seed_config: str | None,
    out: str,
    extra: dict,
    resume: str | None = None,
    save_to: str | None = None,
) -> dict:
    """mode "ddp": transformers.Trainer; "zero": ZeroTrainer with the seed config. Returns the global losses,
    eval losses, final weights and (with save_to) what from_pretrained reads back from save_model()."""
    import transformers

    from zero_core.integrations.transformers import TrainingArguments, ZeroTrainer

    model = tiny_model(kind)
    config = json.loads((SEEDS / seed_config).read_text()) if seed_config is not None else {}
    if mode == "zero":
        trainer_cls, args = recording(ZeroTrainer), arguments(TrainingArguments, out, world, seed_config, **extra)
    else:
        trainer_cls = recording(transformers.Trainer, "scheduler" in config, "optimizer" in config)
        args = arguments(transformers.TrainingArguments, out, world, None, **extra)
    trainer = trainer_cls(
        model=model, args=args, train_dataset=Samples(kind, SAMPLES, 1), eval_dataset=Samples(kind, 8, 2)
    )
    trainer.train(resume_from_checkpoint=resume)
    weights = (
        trainer.engine.full_state_dict()
        if mode == "zero"
        else {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    )
    result = {
        "losses": global_losses(trainer.losses, world),
        "weights": weights,
        "eval": [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h],
        "logged_lrs": [h["learning_rate"] for h in trainer.state.log_history if "loss" in h],
    }
    if save_to is not None:
        trainer.save_model(save_to)
        if rank == 0:
            cls = type(model)
            result["loaded"] = {k: v.clone() for k, v in cls.from_pretrained(save_to).state_dict().items()}
        dist.barrier()
    return result


def parity(rank: int, world: int, kind: str, seed_config: str, out: str, extra: dict) -> dict:
    """The DDP reference and ZeroTrainer (which also saves its model) in the same ranks, one after the other."""
    return {
        "ddp": run(rank, world, "ddp", kind, seed_config, f"{out}/ddp", extra),
        "zero": run(rank, world, "zero", kind, seed_config, f"{out}/zero", extra, save_to=f"{out}/saved"),
    }


def global_losses(losses: list[float], world: int) -> list[float]:
    every = [None] * world
    dist.all_gather_object(every, losses)
    assert all(len(x) == len(losses) for x in every), every
    return [math.fsum(step) / world for step in zip(*every)]

"""The learning rates ZeroTrainer logs equal those Trainer logs on DeepSpeed, for each place the schedule comes from.

The expected lists were recorded from transformers 5.24 Trainer on DeepSpeed 0.19.8 (CPU accelerator, ZeRO-2, one
rank) with the run below: a tiny GPT-2, 6 updates of 2 micro-batches of 4, lr 1e-3, linear schedule with 2 warmup
steps. Who steps the schedule decides what is logged: Trainer's own scheduler over its own optimizer is stepped by
Trainer after it logs (the lr of the update just applied, as plain Trainer logs it); a schedule DeepSpeed steps (the
config's, or Trainer's built on the config's optimizer) has moved to the next update's lr by then.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

BATCHES = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "train_batch_size": "auto", "gradient_clipping": "auto", "zero_optimization": {"stage": 2}}
CONFIG_OPTIMIZER = {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}
CONFIG_SCHEDULER = {"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                                 "warmup_num_steps": "auto"}}}

# Trainer + DeepSpeed: config without optimizer or scheduler sections (Trainer's AdamW and linear schedule)
TRAINERS_OWN = [0.0, 0.0005, 0.001, 0.00075, 0.0005, 0.00025]
# config "optimizer" section, no "scheduler": DeepSpeed steps Trainer's linear schedule
ON_CONFIG_OPTIMIZER = [0.0005, 0.001, 0.00075, 0.0005, 0.00025, 0.0]
# config "scheduler" section (WarmupLR, "auto" filled by Trainer), Trainer's AdamW
CONFIG_WARMUP = [0.0, 0.001, 0.001, 0.001, 0.001, 0.001]


def _train(out: str, extra: dict, save_steps: int = 0) -> list[dict]:
    from transformers import GPT2Config, GPT2LMHeadModel

    from zero_core.integrations.transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    ids = torch.randint(0, 64, (48, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": t, "labels": t} for t in ids]
    saving = {"save_strategy": "steps", "save_steps": save_steps} if save_steps else {"save_strategy": "no"}
    args = TrainingArguments(output_dir=out, deepspeed={**BATCHES, **extra}, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, max_steps=6, logging_steps=1, learning_rate=1e-3,
                             lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.1, report_to=[], seed=0,
                             max_grad_norm=1.0, use_cpu=True, disable_tqdm=True, **saving)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return trainer.state.log_history


def _lrs(history: list[dict]) -> list[float]:
    return [entry["learning_rate"] for entry in history if "learning_rate" in entry]


def test_trainers_own_schedule_logs_the_lr_of_the_update_applied(tmp_path):
    history = _train(str(tmp_path), {}, save_steps=6)
    assert _lrs(history) == pytest.approx(TRAINERS_OWN, abs=1e-12)
    saved = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    assert _lrs(saved["log_history"]) == pytest.approx(TRAINERS_OWN, abs=1e-12)


@pytest.mark.parametrize("extra,expected", [
    (CONFIG_OPTIMIZER, ON_CONFIG_OPTIMIZER),
    (CONFIG_SCHEDULER, CONFIG_WARMUP),
])
def test_a_schedule_deepspeed_steps_logs_the_next_lr(tmp_path, extra, expected):
    assert _lrs(_train(str(tmp_path), extra)) == pytest.approx(expected, abs=1e-12)

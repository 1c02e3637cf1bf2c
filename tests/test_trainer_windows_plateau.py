"""ZeroTrainer where Trainer's loop decides more than the engine's counters: an epoch whose batches do not fill the
last accumulation window, and `lr_scheduler_type="reduce_lr_on_plateau"`, which steps on a metric.

The expected rows (step, loss, lr, grad norm as Trainer logs them) were recorded from transformers 5.24 Trainer on
DeepSpeed 0.19.8 (CPU accelerator, ZeRO-2, one rank, torch AdamW) with the same run: a tiny GPT-2, lr 1e-2,
micro-batches of 2. With the plateau schedule over Trainer's own optimizer, Trainer steps it after each evaluation
with the eval loss; over the config's optimizer DeepSpeed's engine steps it after each update with the train batch
size as its metric (its fallback when `step()` wants one), so the lr halves at every update from the second on.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

BATCHES = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "gradient_clipping": "auto", "zero_optimization": {"stage": 2}}
CONFIG_OPTIMIZER = {"optimizer": {"type": "AdamW",
                                  "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}}}
PLATEAU = {"lr_scheduler_type": "reduce_lr_on_plateau", "lr_scheduler_kwargs": {"patience": 0, "factor": 0.5},
           "eval_strategy": "steps", "eval_steps": 1}

# 10 samples, 2 epochs of 5 batches in windows of 2, 2 and 1: the short window ends each epoch with an update
WINDOWS = [(1, 3.6382980346679688, 0.008333333333333333, 1.9579616785049438),
           (2, 3.6295275688171387, 0.006666666666666666, 1.1429824829101562),
           (3, 3.650775671005249, 0.005, 1.6594147682189941),
           (4, 3.530195951461792, 0.003333333333333333, 1.3436164855957031),
           (5, 3.4466729164123535, 0.0016666666666666666, 1.215693712234497),
           (6, 3.392259120941162, 0.0, 1.7593917846679688)]
PLATEAU_LOSSES = [3.628380298614502, 3.678171157836914, 3.5938873291015625, 3.6251869201660156, 3.3553452491760254,
                  3.510511875152588, 3.325204610824585, 3.422114610671997, 3.3140709400177, 3.3789005279541016,
                  3.3660552501678467, 3.4434351921081543]
HALVING = [0.01 * 0.5**k for k in range(12)]
TRAINERS_OPTIMIZER_LRS = [0.01, *HALVING[:11]]  # the first eval sets the best loss, each later one halves the lr
CONFIG_OPTIMIZER_LRS = HALVING  # logged after DeepSpeed stepped it: the next update's lr


def _train(out: str, config: dict, samples: int, extra: dict, resume: str | None = None) -> list[tuple]:
    from transformers import GPT2Config, GPT2LMHeadModel

    from zero_core.integrations.transformers import Trainer, TrainingArguments

    def data(n: int, seed: int) -> list[dict]:
        ids = torch.randint(0, 64, (n, 8), generator=torch.Generator().manual_seed(seed))
        return [{"input_ids": t, "labels": t} for t in ids]

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    args = TrainingArguments(output_dir=out, deepspeed=config, per_device_train_batch_size=2, learning_rate=1e-2,
                             logging_steps=1, report_to=[], seed=0, max_grad_norm=1.0, use_cpu=True,
                             disable_tqdm=True, **extra)
    trainer = Trainer(model=model, args=args, train_dataset=data(samples, 1), eval_dataset=data(4, 2))
    trainer.train(resume_from_checkpoint=resume)
    return [(h["step"], h["loss"], h["learning_rate"], h["grad_norm"]) for h in trainer.state.log_history
            if "loss" in h]


def test_a_short_last_window_of_an_epoch_updates_as_on_deepspeed(tmp_path):
    rows = _train(str(tmp_path), {**BATCHES, **CONFIG_OPTIMIZER}, 10,
                  {"gradient_accumulation_steps": 2, "num_train_epochs": 2, "save_strategy": "no"})
    assert [r[0] for r in rows] == [r[0] for r in WINDOWS]
    for got, want in zip(rows, WINDOWS):
        assert got[1:] == pytest.approx(want[1:], rel=1e-5, abs=1e-7)


@pytest.mark.slow  # two trainers, a few seconds
def test_plateau_over_trainers_optimizer_steps_on_the_eval_loss_and_resumes(tmp_path):
    rows = _train(str(tmp_path / "run"), BATCHES, 8, {**PLATEAU, "save_strategy": "steps", "save_steps": 3})
    assert [r[2] for r in rows] == pytest.approx(TRAINERS_OPTIMIZER_LRS, rel=1e-9)
    assert [r[1] for r in rows] == pytest.approx(PLATEAU_LOSSES, rel=1e-5)
    resumed = _train(str(tmp_path / "resumed"), BATCHES, 8, {**PLATEAU, "save_strategy": "no"},
                     resume=str(tmp_path / "run" / "checkpoint-3"))
    assert [r[2] for r in resumed] == pytest.approx(TRAINERS_OPTIMIZER_LRS, rel=1e-9)
    assert [r[1] for r in resumed[3:]] == pytest.approx([r[1] for r in rows[3:]], rel=1e-6)


def test_plateau_over_the_config_optimizer_steps_as_deepspeeds_engine_does(tmp_path):
    rows = _train(str(tmp_path), {**BATCHES, **CONFIG_OPTIMIZER}, 8, {**PLATEAU, "save_strategy": "no"})
    assert [r[2] for r in rows] == pytest.approx(CONFIG_OPTIMIZER_LRS, rel=1e-9)
    assert [r[1] for r in rows] == pytest.approx(PLATEAU_LOSSES, rel=1e-5)

"""The engine's own monitor events, as DeepSpeed's engine writes them after each accumulation boundary's step:
`Train/Samples/lr` at the samples trained so far (and `Train/Samples/loss_scale` under fp16), on rank 0.

Expected files: DeepSpeed 0.19.8 on CPU (DS_ACCELERATOR=cpu, one process), the same script as `_train` (ZeRO stage 1,
fp32, torch Adam, WarmupLR over 4 updates, accumulation 2, micro-batch 2, 10 micro-steps, steps_per_print 2):
its csv_monitor folder held Train_Samples_lr.csv only, `step,lr` then 4,0.0 / 8,0.005 / 12,0.007924812503605782 /
16,0.01 / 20,0.01 (written at every update, not only at steps_per_print); its losses are DS_LOSSES. DeepSpeed
refuses fp16 on CPU: there its engine.step() gives the tag, header and steps (the loss scale after the update)."""

from __future__ import annotations

import csv

import pytest
import torch

import zero_core.deepspeed as deepspeed

DS_LOSSES = [0.28117597103118896, 0.9827632904052734, 0.17403453588485718, 1.0371417999267578, 0.5230849981307983,
             0.8245391249656677, 1.0391186475753784, 0.6337152123451233, 0.6356215476989746, 1.3356266021728516]
DS_LR_ROWS = [(4, 0.0), (8, 0.005), (12, 0.007924812503605782), (16, 0.01), (20, 0.01)]


def _engine(**extra):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 2,
              "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                                           "warmup_num_steps": 4}},
              "zero_optimization": {"stage": 1}, **extra}
    config = {k: v for k, v in config.items() if v is not None}  # None: the key left out
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def _train(engine, micro_steps: int = 10) -> list[float]:
    gen = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(micro_steps):
        x, y = torch.randn(2, 6, generator=gen), torch.randn(2, 3, generator=gen)
        loss = (engine(x.to(engine.device, engine.dtype)) - y.to(engine.device)).pow(2).mean()  # fp16: in half
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def _rows(path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_csv_monitor_gets_deepspeeds_update_events(tmp_path):
    engine = _engine(csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "run"})
    assert _train(engine) == pytest.approx(DS_LOSSES, abs=1e-6)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["Train_Samples_lr.csv"]
    rows = _rows(tmp_path / "run" / "Train_Samples_lr.csv")
    assert rows[0] == ["step", "lr"]
    assert [int(r[0]) for r in rows[1:]] == [step for step, _ in DS_LR_ROWS]
    assert [float(r[1]) for r in rows[1:]] == pytest.approx([lr for _, lr in DS_LR_ROWS], abs=1e-6)


def test_fp16_adds_the_loss_scale_at_the_same_steps(tmp_path):
    engine = _engine(csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "run"},
                     fp16={"enabled": True, "initial_scale_power": 8})
    _train(engine, micro_steps=4)
    names = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert names == ["Train_Samples_loss_scale.csv", "Train_Samples_lr.csv"]
    rows = _rows(tmp_path / "run" / "Train_Samples_loss_scale.csv")
    assert rows[0] == ["step", "loss_scale"] and [r[0] for r in rows[1:]] == ["4", "8"]
    assert [float(r[1]) for r in rows[1:]] == [engine.loss_scale] * 2  # 256, the scale the updates left


def test_monitor_off_reads_nothing_at_the_step(monkeypatch):
    engine = _engine(scheduler=None)  # no schedule: the step itself never asks for the lr

    def no_read(*_):
        raise AssertionError("the step read the lr with the monitor off")

    monkeypatch.setattr(engine, "get_lr", no_read)
    _train(engine, micro_steps=4)
    assert engine.global_steps == 2

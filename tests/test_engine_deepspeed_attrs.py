"""DeepSpeed engine attributes that training scripts read on `zero_core.deepspeed`'s engine: `engine._config`
(DeepSpeedConfig's values), `engine.monitor` (csv_monitor in DeepSpeed's file layout) and `engine.timers`."""

from __future__ import annotations

import csv

import pytest
import torch
from parity_workers import ds_config, make_model

import zero_core.deepspeed as deepspeed


def _engine(stage: int = 2, dtype: str = "bf16", **extra):
    offload = {"offload_optimizer": {"device": "cpu"}} if stage else {}
    cfg = ds_config(stage, dtype, 2, gas=2, clip=0.5, **offload)
    cfg.update(extra)
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def test_config_object_answers_deepspeeds_attributes():
    engine = _engine(steps_per_print=7)
    c = engine._config
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == (4, 2, 2)
    assert c.zero_optimization_stage == 2 and c.zero_enabled is True
    assert c.bfloat16_enabled is True and c.fp16_enabled is False
    assert c.float16_config.enabled is False and c.bfloat16_config.enabled is True
    assert c.gradient_clipping == 0.5 and c.steps_per_print == 7
    assert c.zero_config.stage == 2 and c.zero_config.offload_optimizer.device == "cpu"
    assert c.optimizer_name == "adamw" and c.optimizer_params["betas"] == [0.9, 0.95]
    assert c.communication_data_type is None and c.world_size == 1 and c.monitor_config.enabled is False
    assert c.grad_accum_dtype is None  # not set: DeepSpeed leaves it None too
    with pytest.raises(AttributeError, match="'no_such_key'"):
        c.no_such_key
    with pytest.raises(AttributeError, match="read-only"):
        c.train_batch_size = 8
    c.optimizer_params["lr"] = 1.0  # a copy: the engine's config stays as it was built
    assert engine._config.optimizer_params["lr"] != 1.0 and engine.config["optimizer"]["params"]["lr"] != 1.0


def test_config_object_at_stage_zero_fp16():
    c = _engine(stage=0, dtype="fp16")._config
    assert c.zero_enabled is False and c.zero_optimization_stage == 0
    assert c.fp16_enabled is True and c.bfloat16_enabled is False


def test_monitor_writes_deepspeeds_csv_layout(tmp_path):
    engine = _engine(csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "run1"})
    assert engine.monitor.enabled and engine._config.monitor_config.csv_monitor.job_name == "run1"
    engine.monitor.write_events([("Train/Samples/train_loss", torch.tensor(2.5), 4), ("lr", 0.001, 4)])
    engine.monitor.write_events([("Train/Samples/train_loss", 2.0, 8)])
    with open(tmp_path / "run1" / "Train_Samples_train_loss.csv", newline="") as f:
        assert list(csv.reader(f)) == [["step", "train_loss"], ["4", "2.5"], ["8", "2.0"]]
    with open(tmp_path / "run1" / "lr.csv", newline="") as f:
        assert list(csv.reader(f)) == [["step", "lr"], ["4", "0.001"]]
    engine.monitor.write_events([("../escape", 1.0, 1)])  # the tag's "/" never leaves the folder
    assert (tmp_path / "run1" / ".._escape.csv").exists() and not (tmp_path / "escape.csv").exists()
    with pytest.raises(ValueError, match="tag, value, step"):
        engine.monitor.write_events([("loss", 1.0)])


def test_monitor_without_sections_drops_events(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    engine = _engine(wandb={"enabled": True, "project": "p"})
    assert engine.monitor.enabled is False
    engine.monitor.write_events([("loss", 1.0, 1)])
    assert list(tmp_path.iterdir()) == []


def test_monitor_refuses_a_bad_section_in_one_line():
    with pytest.raises(ValueError, match=r"csv_monitor.enabled must be true or false.*; fix"):
        _engine(csv_monitor={"enabled": "yes"})  # refused with the config, before the monitor is made


def test_timers_measure_and_log(capsys):
    engine = _engine()
    timer = engine.timers("fwd")
    assert engine.timers("fwd") is timer
    timer.start()
    with pytest.raises(RuntimeError, match="already started"):
        timer.start()
    timer.stop()
    timer.start()
    timer.stop()
    assert len(timer.spans) == 2 and timer.elapsed(reset=False) >= 0.0
    assert engine.timers.get_mean(["fwd"])["fwd"] >= 0.0
    line = engine.timers.log(["fwd", "not_started"])
    assert line.startswith("time (ms) | fwd: ") and "not_started" not in line
    assert line in capsys.readouterr().out
    assert timer.spans == []  # log resets by default, as DeepSpeed's
    with pytest.raises(RuntimeError, match="not started"):
        timer.stop()
    for call in (engine.timers.log, engine.timers.get_mean):
        with pytest.raises(ValueError, match=rf"timers.{call.__name__} normalizer must be > 0, got 0; pass a positive"):
            call(["fwd"], normalizer=0)

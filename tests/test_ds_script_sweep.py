"""What DeepSpeed's public training scripts pass to `deepspeed.initialize`, on `zero_core.deepspeed`.

DeepSpeed-Chat's `get_train_ds_config` sets `offload_param` and `offload_optimizer` to the CPU with `--offload`
whatever `--zero_stage` is (its default is 0). DeepSpeed 0.19.8 reads offload_param at stage 3 only and
offload_optimizer at stages 1-3, and below those trains as if the sections were absent (observed: its 2-rank bf16
runs of such a script at stages 0-2 printed the same losses with and without `--offload`)."""

from __future__ import annotations

import copy

import pytest
import torch
from parity_workers import ds_config, make_batches, make_model

import zero_core.deepspeed as deepspeed

CPU = {"device": "cpu"}


def _trained(cfg: dict) -> dict:
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for x, y in make_batches(3, 2):
        engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
        engine.step()
    state = engine.full_state_dict()
    engine.close()
    return state


@pytest.mark.parametrize("stage, unread, kept", [
    (2, {"offload_param": CPU}, {"offload_optimizer": CPU}),  # DeepSpeed-Chat's --offload --zero_stage 2
    (1, {"cpu_offload_param": True}, {}),  # DeepSpeed's deprecated boolean for offload_param
    (0, {"offload_param": CPU, "offload_optimizer": CPU}, {}),  # DeepSpeed-Chat's --offload at its default stage
])
def test_offload_sections_deepspeed_does_not_read_at_the_stage_are_left_out(capsys, stage, unread, kept):
    cfg = ds_config(stage, "fp32", 2, **unread, **kept)
    given = copy.deepcopy(cfg)
    got = _trained(cfg)
    assert cfg == given  # the script's dict is not changed
    note = [line for line in capsys.readouterr().out.splitlines() if "left out" in line]
    assert len(note) == 1 and f"at ZeRO stage {stage} " in note[0], note
    assert all(f"zero_optimization.{name}" in note[0] for name in unread), note
    want = _trained(ds_config(stage, "fp32", 2, **kept))
    assert all(torch.equal(got[k], v) for k, v in want.items())


def test_offload_sections_read_at_the_stage_stay(capsys):
    cfg = ds_config(3, "fp32", 2, offload_param=CPU, offload_optimizer=CPU)
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    assert engine.zero_offload_param().device == "cpu" and engine.zero_offload_optimizer().device == "cpu"
    assert "left out" not in capsys.readouterr().out
    engine.close()


def test_deepspeed_config_reads_them_as_initialize_does(capsys):
    """`deepspeed.DeepSpeedConfig(cfg)`, which DeepSpeed builds from such a config without a word."""
    cfg = ds_config(2, "bf16", 2, offload_param=CPU, offload_optimizer=CPU)
    read = deepspeed.DeepSpeedConfig(cfg)
    assert read.zero_optimization_stage == 2 and read.zero_config.offload_optimizer.device == "cpu"
    assert read._param_dict["zero_optimization"]["offload_param"] == CPU  # the config as given
    assert "left out" not in capsys.readouterr().out

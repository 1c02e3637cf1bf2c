"""The `zero_to_fp32.py` written beside `latest` takes DeepSpeed 0.19.8's flags and passes them on as DeepSpeed's
script does (to `convert_zero_checkpoint_to_fp32_state_dict`): `--exclude_frozen_parameters` leaves the frozen
parameters out, `--safe_serialization`, `--max_shard_size`, `-t/--tag` and `-d/--debug` are taken. Run in this
process (runpy) on a checkpoint of a model whose first layer is frozen."""

from __future__ import annotations

import runpy
import sys

import pytest
import torch
from safetensors.torch import load_file

import zero_core.deepspeed as deepspeed
from zero_core.recovery_script import NAME


def _checkpoint(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    net[0].weight.requires_grad_(False)
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "zero_optimization": {"stage": 1}}
    engine, *_ = deepspeed.initialize(model=net, model_parameters=[p for p in net.parameters() if p.requires_grad],
                                      config=cfg)
    engine.backward(torch.nn.functional.mse_loss(engine(torch.randn(2, 4)), torch.randn(2, 2)))
    engine.step()
    engine.save_checkpoint(tmp_path / "ck", tag="t1")
    full = {k: v.clone() for k, v in engine.module.state_dict().items()}
    engine.close()
    return tmp_path / "ck", full


def _run(monkeypatch, script, *args):
    monkeypatch.setattr(sys, "argv", [str(script), *map(str, args)])
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        assert e.code in (None, 0), e.code


@pytest.mark.parametrize("safe", [False, True])
def test_exclude_frozen_parameters_is_passed_on(tmp_path, monkeypatch, safe):
    ck, full = _checkpoint(tmp_path)
    script = ck / NAME
    flags = ["--safe_serialization"] if safe else []

    def written(out):
        if safe:
            return {k: v for f in out.glob("*.safetensors") for k, v in load_file(f).items()}
        return torch.load(out / "pytorch_model.bin", weights_only=True)

    _run(monkeypatch, script, ck, tmp_path / "all", "-t", "t1", "--max_shard_size", "5GB", "-d", *flags)
    everything = written(tmp_path / "all")
    assert set(everything) == set(full) and all(torch.equal(everything[k], full[k]) for k in full)
    _run(monkeypatch, script, ck, tmp_path / "trained", "--exclude_frozen_parameters", *flags)
    trained = written(tmp_path / "trained")
    assert set(trained) == set(full) - {"0.weight"}
    assert all(torch.equal(trained[k], full[k]) for k in trained)

"""Checkpoints of Lightning's ModelParallelStrategy (FSDP2) and DeepSpeedStrategy (ZeRO-2 and ZeRO-3), and of an HF
Trainer / Accelerate FSDP save, made by the real tools on the CPU (tests/fixtures/make_lightning_fixtures.py,
make_lightning_deepspeed_fixtures.py, make_accelerate_fixtures.py), convert to names that load strictly into the
user's model (a tied alias stored once); the Trainer's checkpoint-N/ folder needs no --tag."""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from checkpoint_helpers import FIXTURES
from checkpoints.dcp_source import user_name
from helpers import cli

sys.path.insert(0, str(FIXTURES))
from make_deepspeed_fixtures import Tiny  # noqa: E402


class LightningLike(nn.Module):
    """How a LightningModule holding `self.model = Tiny()` names its state (lightning is not needed here)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Tiny()


def _convert(src, out) -> dict:
    result = cli("convert", src, "--to", "fp32", "--out", out)
    assert result.exit_code == 0, result.output
    return load_file(out / "model.safetensors")


def test_lightning_model_parallel_checkpoint_loads_strictly_into_the_lightning_module(tmp_path):
    folder = FIXTURES / "lightning" / "model_parallel"
    state = _convert(folder / "epoch=0-step=2.ckpt", tmp_path / "out")
    module = LightningLike()
    module.load_state_dict(state, strict=True)
    expected = load_file(folder / "expected_full.safetensors")
    assert expected.keys() == module.state_dict().keys()
    assert all(torch.equal(module.state_dict()[k], v) for k, v in expected.items())


@pytest.mark.parametrize("stage", [2, 3])
def test_lightning_deepspeed_checkpoint_loads_strictly_into_the_lightning_module(tmp_path, stage):
    folder = FIXTURES / "lightning_deepspeed" / str(stage)
    state = _convert(folder / "epoch=0-step=2.ckpt", tmp_path / "out")  # names without `_forward_module.`
    module = LightningLike()
    missing, unexpected = module.load_state_dict(state, strict=False)
    assert unexpected == [] and missing == ["model.head.weight"]  # the tied head, stored once (as safetensors does)
    expected = load_file(folder / "expected_full.safetensors")  # DeepSpeed's own consolidation
    assert state.keys() == expected.keys()
    assert all(torch.equal(module.state_dict()[k], v) for k, v in expected.items())


def test_trainer_checkpoint_folder_picks_the_model_without_tag(tmp_path):
    folder = FIXTURES / "accelerate" / "checkpoint-2"
    assert "pytorch_model_fsdp_0" in cli("inspect", folder).output
    state = _convert(folder, tmp_path / "out")
    model = Tiny()
    model.load_state_dict(state, strict=True)
    expected = load_file(folder / "expected_full.safetensors")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())


def test_wrapper_segments_leave_the_users_names():
    assert user_name("_forward_module.model._orig_mod.lin1.weight") == "model.lin1.weight"
    assert user_name("model._orig_mod.emb.weight") == "model.emb.weight"
    assert user_name("my_orig_mod.weight") == "my_orig_mod.weight"

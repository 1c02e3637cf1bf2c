"""DCP folders as real tools nest them (PyTorch's DCP recipe `{"app": AppState}`, a torch.compile'd model) convert
to names that load strictly into the user's model; `--key` picks any prefix."""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import load_file

from checkpoint_helpers import DEEPSPEED, FIXTURES
from checkpoints.detect import open_source
from helpers import cli, one_line_error

sys.path.insert(0, str(FIXTURES))
from make_deepspeed_fixtures import Tiny  # noqa: E402

DCP = FIXTURES / "dcp"


@pytest.mark.parametrize("name", ["app_state", "compiled", "model_optim"])
def test_converted_names_load_strictly_into_the_users_model(tmp_path, name):
    result = cli("convert", DCP / name, "--to", "fp32", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    state = load_file(tmp_path / "out" / "model.safetensors")
    model = Tiny()
    model.load_state_dict(state, strict=True)
    expected = load_file(DCP / name / "expected_full.safetensors")
    assert all(torch.equal(model.state_dict()[k].float(), v.float()) for k, v in expected.items())


def test_key_picks_the_prefix_and_a_wrong_one_is_one_line(tmp_path):
    auto = open_source(DCP / "app_state")
    explicit = open_source(DCP / "app_state", key="app.model")
    assert [i.name for i in auto.params()] == [i.name for i in explicit.params()]
    optim = open_source(DCP / "app_state", key="app.optim.state")  # any prefix: here the optimizer's moments
    assert any(i.name.endswith("exp_avg") for i in optim.params())
    line = one_line_error(
        cli("convert", DCP / "app_state", "--to", "fp32", "--out", tmp_path / "o", "--key", "trainer")
    )
    assert "no model tensors under --key 'trainer'" in line and "app" in line and "pass --key" in line
    line = one_line_error(cli("inspect", DEEPSPEED[0], "--key", "model"))
    assert "--key applies to DCP checkpoints" in line

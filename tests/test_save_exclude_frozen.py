"""`engine.save_checkpoint(exclude_frozen_parameters=True)`, as DeepSpeed's: the frozen parameters (a LoRA run's base
weights) are left out and named in the manifest's `excluded`; buffers stay. A load keeps the model's own values for
them and says so, one that would train one of them with its optimizer states is one line, and `zbench inspect` and
`convert` say what the checkpoint does not hold. The fixtures' Tiny model, its norm.weight frozen."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from test_checkpoint_safety import _rewrite
from test_foreign_untrained_entries import _engine, _tiny

from checkpoints import manifest as mf
from checkpoints.source import CheckpointError
from helpers import cli, one_line_error


def _trained(tmp_path, exclude: bool, async_save: bool = False):
    engine = _engine(_tiny(""), 2)
    torch.manual_seed(3)
    for _ in range(2):
        engine.backward(engine(torch.randint(0, 11, (2, 5))))
        engine.step()
    engine.save_checkpoint(tmp_path, tag="t", exclude_frozen_parameters=exclude, async_save=async_save)
    engine.wait_for_checkpoint()
    states = {k: getattr(engine.optimizer.states, k).clone() for k in ("master", "exp_avg", "exp_avg_sq")}
    engine.close()
    return tmp_path / "t", states


@pytest.mark.parametrize("async_save", [False, True])
def test_frozen_parameters_are_left_out_and_named_buffers_stay(tmp_path, async_save):
    folder, _ = _trained(tmp_path, exclude=True, async_save=async_save)
    manifest = json.loads((folder / mf.MANIFEST).read_text())
    assert manifest["excluded"] == ["norm.weight"]
    assert "norm.weight" not in {p["name"] for p in manifest["params"]}
    with safe_open(folder / mf.FROZEN_FILE, "pt") as f:
        assert set(f.keys()) == {"mix"}


def test_a_load_keeps_the_models_own_frozen_values_and_takes_the_rest(tmp_path, capsys):
    full, states = _trained(tmp_path / "full", exclude=False)
    lean, _ = _trained(tmp_path / "lean", exclude=True)
    loaded = []
    for folder in (full, lean):
        model = _tiny("")
        with torch.no_grad():
            model.norm.weight.fill_(0.25)  # not the saved run's value: shows which one the load keeps
        engine = _engine(model, 2)
        capsys.readouterr()
        engine.load_checkpoint(folder.parent)
        out = capsys.readouterr().out
        loaded.append((engine.full_state_dict(), out))
        assert all(torch.equal(getattr(engine.optimizer.states, k), v) for k, v in states.items())
        engine.close()
    (from_full, _), (from_lean, said) = loaded
    assert not torch.equal(from_full["norm.weight"], torch.full((13,), 0.25))  # a full save brings the run's
    assert torch.equal(from_lean["norm.weight"], torch.full((13,), 0.25))  # a lean one keeps the model's
    assert all(torch.equal(from_lean[k], v) for k, v in from_full.items() if k != "norm.weight")
    assert "holds no frozen parameter norm.weight (saved without frozen parameters)" in said


def test_a_left_out_parameter_trained_now_is_one_line_with_its_states_and_loads_without(tmp_path):
    folder, _ = _trained(tmp_path, exclude=True)
    engine = _engine(_tiny("frozen now trained"), 2)
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(tmp_path)
    assert "\n" not in str(e.value) and "norm.weight is trained by this model but was frozen" in str(e.value)
    own = engine.full_state_dict()["norm.weight"]
    engine.load_checkpoint(tmp_path, load_optimizer_states=False)
    assert torch.equal(engine.full_state_dict()["norm.weight"], own)
    engine.close()


def test_deepspeeds_entries_record_no_frozen_parameters_as_its_save_does(tmp_path):
    """DeepSpeed's save with exclude_frozen_parameters=True writes frozen_param_shapes/fragments as None."""
    _trained(tmp_path / "lean", exclude=True)
    _trained(tmp_path / "full", exclude=False)
    got = {}
    for kind in ("lean", "full"):
        engine = _engine(_tiny(""), 2)
        _, client_state = engine.load_checkpoint(tmp_path / kind)
        got[kind] = client_state
        engine.close()
    assert got["lean"]["frozen_param_shapes"] is None and got["lean"]["frozen_param_fragments"] is None
    assert list(got["full"]["frozen_param_shapes"]) == ["norm.weight"]


def test_inspect_and_convert_say_what_the_checkpoint_does_not_hold(tmp_path):
    folder, _ = _trained(tmp_path / "ck", exclude=True)
    shown = cli("inspect", tmp_path / "ck")
    assert shown.exit_code == 0 and "1 frozen parameters (exclude_frozen_parameters)" in shown.output
    done = cli("convert", tmp_path / "ck", "--to", "fp32", "--out", tmp_path / "out")
    assert done.exit_code == 0 and "not written: 1 frozen parameters" in done.output, done.output
    with safe_open(next((tmp_path / "out").glob("*.safetensors")), "pt") as f:
        assert "norm.weight" not in f.keys() and "lin1.weight" in f.keys()


@pytest.mark.parametrize("excluded", [["lin1.weight"], ["norm.weight", "norm.weight"], "norm.weight", [3]])
def test_a_crafted_excluded_list_is_one_line(tmp_path, excluded):
    folder, _ = _trained(tmp_path / "ck", exclude=True)
    _rewrite(folder, lambda m: m.update(excluded=excluded))
    assert "'excluded'" in one_line_error(cli("inspect", tmp_path / "ck"))

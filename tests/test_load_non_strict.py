"""`engine.load_checkpoint(load_module_strict=False)`, as DeepSpeed's non-strict module load: a model with entries
the checkpoint lacks (an adapter, a new buffer) and without some it saved takes the weights they share, keeps its
own for the rest and names both; the optimizer states of another set of entries are refused in one line, and shapes
must still agree. For zbench, DeepSpeed (tests/fixtures/deepspeed/2_2_fp32) and DCP (dcp/model_optim) checkpoints,
all of the fixtures' Tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_foreign_untrained_entries import _engine as tiny_engine
from test_foreign_untrained_entries import _tiny as tiny

from checkpoints.source import CheckpointError
from helpers import FIXTURES

SOURCES = ["zbench", "deepspeed", "dcp"]


def _tiny(change: str = "") -> torch.nn.Module:
    """The fixtures' Tiny, its norm.weight frozen as their runs froze it, `changed` (test_foreign_untrained_entries)."""
    if change != "adapted":
        return tiny({"buffer added": "buffer not saved", "resized": "buffer shape"}.get(change, change))
    model = tiny("buffer not kept")  # the saved `mix` no longer part of the state dict
    torch.manual_seed(1)
    model.adapter = torch.nn.Linear(7, 7)  # and two entries no checkpoint has
    model.register_buffer("scale", torch.full((3,), 2.0))
    return model


def _engine(model: torch.nn.Module):
    return tiny_engine(model, 2)


def _checkpoint(source: str, tmp_path: Path) -> Path:
    if source == "deepspeed":
        return FIXTURES / "deepspeed" / "2_2_fp32"
    if source == "dcp":
        return FIXTURES / "dcp" / "model_optim"
    engine = _engine(_tiny())
    for _ in range(2):  # weights and moments away from their initial values
        engine.backward(engine(torch.randint(0, 11, (2, 5))))
        engine.step()
    engine.save_checkpoint(tmp_path / "zb", tag="t")
    engine.close()
    return tmp_path / "zb" / "t"


def _states(engine) -> dict[str, torch.Tensor]:
    return {k: getattr(engine.optimizer.states, k).clone() for k in ("master", "exp_avg", "exp_avg_sq")}


@pytest.mark.parametrize("source", SOURCES)
def test_the_same_model_loads_non_strictly_as_strictly_optimizer_states_and_all(source, tmp_path, capsys):
    folder = _checkpoint(source, tmp_path)
    loaded = []
    for strict in (True, False):
        engine = _engine(_tiny())
        engine.load_checkpoint(folder, load_module_strict=strict)
        loaded.append((engine.full_state_dict(), _states(engine), engine.global_steps))
        engine.close()
    (weights, states, steps), (weights_ns, states_ns, steps_ns) = loaded
    assert steps == steps_ns > 0
    assert weights.keys() == weights_ns.keys() and all(torch.equal(weights[k], weights_ns[k]) for k in weights)
    assert all(torch.equal(states[k], states_ns[k]) for k in states)
    assert "load_module_strict=False" not in capsys.readouterr().out  # nothing was left out


@pytest.mark.parametrize("source", SOURCES)
def test_a_buffer_the_checkpoint_lacks_still_lets_the_optimizer_states_load(source, tmp_path, capsys):
    folder = _checkpoint(source, tmp_path)
    reference = _engine(_tiny())
    reference.load_checkpoint(folder)
    expected, states = reference.full_state_dict(), _states(reference)
    reference.close()
    engine = _engine(_tiny("buffer added"))
    capsys.readouterr()
    engine.load_checkpoint(folder, load_module_strict=False)
    got = engine.full_state_dict()
    assert torch.equal(got["scale"], torch.full((3,), 2.0)) and all(torch.equal(got[k], v) for k, v in expected.items())
    assert all(torch.equal(getattr(engine.optimizer.states, k), v) for k, v in states.items())
    assert "this model's scale not in it" in capsys.readouterr().out
    engine.close()


@pytest.mark.parametrize("source", SOURCES)
def test_entries_either_side_lacks_are_left_out_and_named(source, tmp_path, capsys):
    folder = _checkpoint(source, tmp_path)
    reference = _engine(_tiny())
    reference.load_checkpoint(folder, load_optimizer_states=False)
    expected = reference.full_state_dict()
    reference.close()
    model = _tiny("adapted")
    own = {k: v.detach().clone() for k, v in model.state_dict().items()}
    engine = _engine(model)
    capsys.readouterr()
    engine.load_checkpoint(folder, load_module_strict=False, load_optimizer_states=False)
    got = engine.full_state_dict()
    assert {"adapter.weight", "adapter.bias", "scale"} < got.keys() and "mix" not in got
    for name in ("adapter.weight", "adapter.bias", "scale"):
        assert torch.equal(got[name], own[name]), name  # the model's own values
    shared = [k for k in expected if k != "mix"]
    assert shared and all(torch.equal(got[k], expected[k]) for k in shared)
    assert not torch.equal(got["lin1.weight"], own["lin1.weight"])  # the checkpoint's weights did come in
    out = capsys.readouterr().out
    assert "load_module_strict=False" in out and all(n in out for n in ("adapter.weight", "scale", "mix")), out
    engine.close()


@pytest.mark.parametrize("source", SOURCES)
def test_optimizer_states_for_other_entries_are_refused_before_anything_changes(source, tmp_path):
    folder = _checkpoint(source, tmp_path)
    engine = _engine(_tiny("adapted"))
    before, states = engine.full_state_dict(), _states(engine)
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(folder, load_module_strict=False)
    line = str(e.value)
    assert "\n" not in line and "adapter.weight" in line and "load_optimizer_states=False" in line, line
    after = engine.full_state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert all(torch.equal(getattr(engine.optimizer.states, k), v) for k, v in states.items())
    engine.close()


@pytest.mark.parametrize("source", SOURCES)
def test_an_entry_of_another_shape_is_refused_even_non_strictly(source, tmp_path):
    folder = _checkpoint(source, tmp_path)
    engine = _engine(_tiny("resized"))
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(folder, load_module_strict=False, load_module_only=True)
    assert "mix" in str(e.value) and "(5,)" in str(e.value).replace("[5]", "(5,)")
    engine.close()

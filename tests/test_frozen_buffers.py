"""Buffers and frozen parameters of a zbench checkpoint, consolidated as DeepSpeed 0.19.8 consolidates its own: a
model with a frozen Linear, a BatchNorm (running statistics, an int64 counter) and a registered buffer, trained
at ZeRO-2 and ZeRO-3 and saved with and without `exclude_frozen_parameters`. `get_fp32_state_dict_from_zero_checkpoint`
and the `zero_to_fp32.py` beside the checkpoint, with and without `exclude_frozen_parameters`, give the entries and
dtypes DeepSpeed's give for its run of the same model, and its buffers bit for bit
(tests/fixtures/frozen_buffers.json, made by tests/fixtures/make_frozen_buffers.py). The manifest's `buffers` tells
the buffers from the frozen parameters; a manifest without it (an older zbench) reads as before."""

from __future__ import annotations

import json
import runpy
import sys

import pytest
import torch
from test_checkpoint_safety import _rewrite

import zero_core.deepspeed as deepspeed
from checkpoints import manifest as mf
from checkpoints.source import CheckpointError
from helpers import FIXTURES, cli, fixture_script, one_line_error
from zero_core.deepspeed.utils import zero_to_fp32 as z
from zero_core.recovery_script import NAME

MAKE = fixture_script("make_frozen_buffers")
DEEPSPEED = json.loads((FIXTURES / "frozen_buffers.json").read_text())


def _trained(stage: int):
    model, batches = MAKE.model_and_batches()
    engine, *_ = deepspeed.initialize(model=model, config=MAKE.config(stage),
                                      model_parameters=[p for p in model.parameters() if p.requires_grad])
    for x in batches:
        engine.backward(engine(x))
        engine.step()
    return engine


def _saved(tmp_path, stage: int, exclude: bool, async_save: bool = False):
    """The checkpoint folder (`ck/t`) and the run's full state dict at save."""
    engine = _trained(stage)
    engine.save_checkpoint(tmp_path / "ck", tag="t", exclude_frozen_parameters=exclude, async_save=async_save)
    engine.wait_for_checkpoint()
    full = {k: v.clone() for k, v in engine.full_state_dict().items()}
    engine.close()
    return tmp_path / "ck" / "t", full


def _listing(state: dict) -> dict[str, str]:
    return {k: str(v.dtype).removeprefix("torch.") for k, v in sorted(state.items())}


def _script(monkeypatch, folder, out, exclude: bool) -> dict:
    """What the `zero_to_fp32.py` beside the checkpoint writes (run in this process, as DeepSpeed's is run)."""
    flags = ["--exclude_frozen_parameters"] if exclude else []
    monkeypatch.setattr(sys, "argv", [NAME, str(folder.parent), str(out), *flags])
    try:
        runpy.run_path(str(folder.parent / NAME), run_name="__main__")
    except SystemExit as e:
        assert e.code in (None, 0), e.code
    return torch.load(out / "pytorch_model.bin", weights_only=True)


@pytest.mark.parametrize("save_exclude", [False, True])
@pytest.mark.parametrize("stage", [2, 3])
def test_consolidated_as_deepspeeds_buffers_kept_bit_for_bit(tmp_path, monkeypatch, stage, save_exclude):
    folder, full = _saved(tmp_path, stage, save_exclude)
    want = DEEPSPEED[f"stage{stage}_save_exclude={save_exclude}"]
    for read_exclude in (False, True):
        state = z.get_fp32_state_dict_from_zero_checkpoint(folder.parent, exclude_frozen_parameters=read_exclude)
        assert _listing(state) == want[f"read_exclude={read_exclude}"]["get"], read_exclude
        written = _script(monkeypatch, folder, tmp_path / f"out_{read_exclude}", read_exclude)
        assert _listing(written) == want[f"read_exclude={read_exclude}"]["script"], read_exclude
        for name, values in want["buffers"].items():  # DeepSpeed's run of the same model and batches
            assert torch.equal(state[name], torch.tensor(values, dtype=state[name].dtype)), name
        for got in (state, written):
            assert all(torch.equal(t, full[k].to(t.dtype)) for k, t in got.items())


@pytest.mark.parametrize(("stage", "async_save"), [(2, False), (3, True)])
def test_a_save_without_frozen_parameters_names_its_buffers_and_a_load_restores_them(tmp_path, stage, async_save):
    folder, _ = _saved(tmp_path, stage, exclude=True, async_save=async_save)
    want = DEEPSPEED[f"stage{stage}_save_exclude=True"]
    manifest = json.loads((folder / mf.MANIFEST).read_text())
    assert sorted(manifest["buffers"]) == want["buffer_names"]  # DeepSpeed's own save lists these
    model, _ = MAKE.model_and_batches()
    with torch.no_grad():
        for b in model.buffers():
            b.fill_(7)  # not the run's values: shows that the load brings them
    engine = deepspeed.initialize(model=model, config=MAKE.config(stage),
                                  model_parameters=[p for p in model.parameters() if p.requires_grad])[0]
    engine.load_checkpoint(folder.parent)
    for name, b in model.named_buffers():
        assert torch.equal(b, torch.tensor(want["buffers"][name], dtype=b.dtype)), name
    engine.close()


def test_a_manifest_without_buffers_reads_as_before(tmp_path):
    """An older zbench's checkpoint does not tell buffers from frozen parameters: excluding the frozen parameters
    leaves out both, as it always did; without exclusion everything is read."""
    folder, full = _saved(tmp_path, 2, exclude=False)
    kept = z.get_fp32_state_dict_from_zero_checkpoint(folder.parent, exclude_frozen_parameters=True)
    assert {"scale", "norm.running_mean", "norm.num_batches_tracked"} <= set(kept)
    _rewrite(folder, lambda m: m.pop("buffers"))
    old = z.get_fp32_state_dict_from_zero_checkpoint(folder.parent, exclude_frozen_parameters=True)
    assert sorted(old) == ["head.bias", "head.weight", "norm.bias", "norm.weight"]
    assert sorted(z.get_fp32_state_dict_from_zero_checkpoint(folder.parent)) == sorted(full)


@pytest.mark.parametrize("buffers", ["scale", ["scale", "scale"], ["head.weight"], ["nothing.saved"], [3]])
def test_a_crafted_buffers_list_is_one_line(tmp_path, buffers):
    folder, _ = _saved(tmp_path, 2, exclude=False)
    _rewrite(folder, lambda m: m.update(buffers=buffers))
    with pytest.raises(CheckpointError, match="'buffers'") as e:
        z.get_fp32_state_dict_from_zero_checkpoint(folder.parent, exclude_frozen_parameters=True)
    assert "\n" not in str(e.value)
    assert "'buffers'" in one_line_error(cli("inspect", folder.parent))

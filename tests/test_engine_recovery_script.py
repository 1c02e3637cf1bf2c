"""`zero_to_fp32.py` (and `zero_to_torch.py`) beside `latest` after engine.save_checkpoint on an engine of
`zero_core.deepspeed.initialize`, as DeepSpeed leaves them: it writes the weights `zbench convert --to fp32` writes;
a user's file of that name is never replaced; resume, pruning and `zbench inspect` do not take it for a checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from parity_workers import ds_config, make_batches, make_model
from safetensors.torch import load_file

import zero_core
import zero_core.deepspeed as deepspeed
from zero_core.recovery_script import MARKER, NAME, SCRIPT, TORCH_NAME, TORCH_SCRIPT


def _engine(through_deepspeed: bool = True):
    cfg = ds_config(2, "fp32", 2)
    if not through_deepspeed:
        return zero_core.initialize(make_model(), cfg)
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def _step(engine, batch):
    x, y = batch
    engine.backward(engine(x[:2].to(engine.device), y[:2].to(engine.device)).loss)
    engine.step()


def _saved(tmp_path, name: str, text: str):
    """One step and a save into tmp_path/ck; the engine and its script `name`, checked to be `text` and runnable."""
    engine = _engine()
    _step(engine, make_batches(1, 2)[0])
    engine.save_checkpoint(tmp_path / "ck")
    script = tmp_path / "ck" / name
    assert script.read_text() == text and os.stat(script).st_mode & 0o100
    return engine, script


def _run(script, *args) -> subprocess.CompletedProcess:
    """The script in a fresh Python, as a user runs it."""
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a fresh Python imports torch and zbench to run the script
def test_the_script_converts_as_zbench_convert(tmp_path):
    engine, script = _saved(tmp_path, NAME, SCRIPT)
    full = engine.full_state_dict()
    # as DeepSpeed's script: pytorch_model.bin by default, safetensors with --safe_serialization
    for flags, out in (([], "bin"), (["--safe_serialization"], "st")):
        done = _run(script, tmp_path / "ck", tmp_path / out, *flags)
        assert done.returncode == 0, done.stderr
        if out == "bin":
            written = torch.load(tmp_path / out / "pytorch_model.bin", weights_only=True)
        else:
            written = {k: v for f in (tmp_path / out).glob("*.safetensors") for k, v in load_file(f).items()}
        assert written and all(torch.equal(written[k], full[k]) for k in written), out  # (ties written once)
    # an output folder that already holds something is refused in one line, nothing written or removed
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    done = _run(script, tmp_path / "ck", tmp_path / "taken")
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["notes.txt"]


@pytest.mark.slow  # a fresh Python imports torch and zbench to run the script
def test_zero_to_torch_writes_the_dtype_asked_for(tmp_path):
    """DeepSpeed 0.19.8 leaves zero_to_torch.py beside zero_to_fp32.py: the same conversion into --dtype (required)."""
    engine, script = _saved(tmp_path, TORCH_NAME, TORCH_SCRIPT)
    done = _run(script, tmp_path / "ck", tmp_path / "bf16", "--dtype", "bf16", "--safe_serialization")
    assert done.returncode == 0, done.stderr
    written = {k: v for f in (tmp_path / "bf16").glob("*.safetensors") for k, v in load_file(f).items()}
    full = engine.full_state_dict()
    assert written and all(v.dtype == torch.bfloat16 and torch.equal(v, full[k].to(torch.bfloat16))
                           for k, v in written.items())
    done = _run(script, tmp_path / "ck", tmp_path / "none")
    assert done.returncode == 2 and "--dtype" in done.stderr and not (tmp_path / "none").exists()


def test_a_users_file_is_kept_and_an_older_one_of_ours_updated(tmp_path):
    engine = _engine()
    batches = make_batches(2, 2)
    _step(engine, batches[0])
    mine = tmp_path / NAME
    mine.write_text("print('my own converter')\n")
    engine.save_checkpoint(tmp_path)
    assert mine.read_text() == "print('my own converter')\n"
    mine.write_text(f"#!/usr/bin/env python\n{MARKER}\nprint('an older version')\n")
    _step(engine, batches[1])
    engine.save_checkpoint(tmp_path, async_save=True)
    engine.wait_for_checkpoint()
    assert mine.read_text() == SCRIPT
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_users_file_is_named_once_per_folder(tmp_path, monkeypatch, capsys):
    """The note that the file there is another's comes at the first save into a folder, not at every save."""
    import zero_core.recovery_script as recovery_script

    monkeypatch.setattr(recovery_script, "_FOREIGN_NOTED", set())
    engine = _engine()
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / NAME).write_text("print('my own converter')\n")
    noted = []
    for i, (folder, batch) in enumerate(zip(("a", "a", "b"), make_batches(3, 2))):
        _step(engine, batch)
        engine.save_checkpoint(tmp_path / folder)
        out = capsys.readouterr().out
        noted += [folder] * out.count("was left as it is")
        assert (tmp_path / folder / f"global_step{i + 1}").is_dir()
    assert noted == ["a", "b"]
    assert all((tmp_path / f / NAME).read_text() == "print('my own converter')\n" for f in ("a", "b"))


def test_resume_pruning_and_inspect_pass_over_it(tmp_path):
    from zbench.cli import main

    engine = _engine()
    for i, batch in enumerate(make_batches(3, 2)):
        _step(engine, batch)
        engine.save_checkpoint(tmp_path, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step3", "latest", NAME, TORCH_NAME]
    fresh = _engine()
    folder, _ = fresh.load_checkpoint(tmp_path)
    assert folder == str(tmp_path / "global_step3" / "rank_00000.safetensors") and fresh.global_steps == 3
    shown = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert shown.exit_code == 0 and "global_step3" in shown.output, shown.output


def test_zero_core_initialize_engines_write_no_script(tmp_path):
    engine = _engine(through_deepspeed=False)
    _step(engine, make_batches(1, 2)[0])
    engine.save_checkpoint(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step1", "latest"]

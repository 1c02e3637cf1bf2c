"""zbench checkpoints: reshard-and-resume across world sizes and stages, atomic saves, integrity checks."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import zero_core
from checkpoints import manifest as mf
from checkpoints import zbench_format as fmt
from checkpoints.source import CheckpointError
from checkpoints.zbench_source import ZbenchSource
from ckpt_workers import STEPS, config, crash_during_second_save, resume, save_from_nvme, uninterrupted_and_save
from dist_harness import run_ranks
from parity_workers import make_model

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

TOL = 1e-6


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    """2 ranks at stage 3: 6 steps straight, and 3 steps saved."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    return ckpt, run_ranks(uninterrupted_and_save, 2, 3, str(ckpt), 3)


@pytest.mark.parametrize("world,stage", [(3, 2), (2, 0)])
def test_resume_on_other_world_size_and_stage(saved, world, stage):
    ckpt, base = saved
    got = run_ranks(resume, world, stage, str(ckpt))
    assert got["global_step"] == STEPS
    assert got["losses"] == pytest.approx(base["losses"][3:], abs=TOL)
    assert _max_diff(got["state"], base["state"]) < TOL


@pytest.mark.parametrize("offload", [False, True, "nvme"])
def test_resume_on_one_rank_at_stage_1(saved, offload, monkeypatch):
    for var in ("ZERO_CORE_HOST_CHUNK_NUMEL", "ZERO_CORE_NVME_CHUNK_NUMEL"):
        monkeypatch.setenv(var, os.environ.get(var, ""))  # restored after: config("nvme") sets them
    ckpt, base = saved
    got = resume(0, 1, 1, str(ckpt), offload)  # a world of one needs no process group
    assert got["losses"] == pytest.approx(base["losses"][3:], abs=TOL)
    assert _max_diff(got["state"], base["state"]) < TOL


def test_nvme_states_save_and_resume_on_another_world_size_and_stage(saved, tmp_path, monkeypatch):
    """Saved from NVMe-backed states on 2 ranks at stage 2, resumed on 1 rank at stage 3 (NVMe again):
    the run continues like the uninterrupted one."""
    for var in ("ZERO_CORE_HOST_CHUNK_NUMEL", "ZERO_CORE_NVME_CHUNK_NUMEL"):
        monkeypatch.setenv(var, os.environ.get(var, ""))
    _, base = saved
    written = run_ranks(save_from_nvme, 2, 2, str(tmp_path), 3)
    assert _max_diff(written["saved_state"], base["saved_state"]) < TOL
    assert mf.verify_files(fmt.resolve(tmp_path), mf.read(fmt.resolve(tmp_path))) == []
    got = resume(0, 1, 3, str(tmp_path), "nvme")
    assert got["losses"] == pytest.approx(base["losses"][3:], abs=TOL)
    assert _max_diff(got["state"], base["state"]) < TOL


def test_layout_and_manifest(saved):
    ckpt, base = saved
    folder = fmt.resolve(ckpt)
    assert folder.name == "global_step3" and fmt.read_latest(ckpt) == "global_step3"
    manifest = mf.read(folder)
    assert manifest["world_size"] == 2 and manifest["stage"] == 3 and manifest["step"] == 3
    assert sorted(manifest["files"]) == ["frozen.safetensors", "rank_00000.safetensors", "rank_00001.safetensors"]
    assert mf.verify_files(folder, manifest) == []
    tied = {p["name"]: p["tied_to"] for p in manifest["params"] if p["tied_to"]}
    assert tied == {"head.weight": "wte.weight"}
    frozen = [p["name"] for p in manifest["params"] if not p["trainable"]]
    assert frozen == ["blocks.0.ln1.bias"]


def test_source_reads_the_saved_weights(saved):
    ckpt, base = saved
    src = ZbenchSource(ckpt)
    names = [p.name for p in src.params()]
    assert names == list(base["saved_state"].keys())
    for name in names:
        assert torch.equal(src.load(name), base["saved_state"][name].float()), name
    summary = src.summary()
    assert (summary.kind, summary.stage, summary.world_size, summary.step) == ("zbench", 3, 2, 3)


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path):
    with pytest.raises(mp.ProcessExitedException):
        run_ranks(crash_during_second_save, 2, 2, str(tmp_path))
    assert fmt.read_latest(tmp_path) == "global_step2"
    assert len(list(tmp_path.glob(".global_step3.partial-*"))) == 1 and not (tmp_path / "global_step3").exists()
    expected = torch.load(tmp_path / "expected_rank0.pt")
    engine = zero_core.initialize(make_model(), config(1, 1))
    assert engine.load_checkpoint(tmp_path)[1] == {"next_batch": 2}
    assert _max_diff(engine.full_state_dict(), expected) == 0.0


def _flip_byte(path: Path, offset: int = -9) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_rank_file_is_named(saved, tmp_path, damage):
    ckpt, _ = saved
    import shutil

    copy = tmp_path / "ck"
    shutil.copytree(ckpt, copy)
    victim = copy / "global_step3" / "rank_00001.safetensors"
    if damage == "flip":
        _flip_byte(victim)
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-100])
    else:
        victim.unlink()
    engine = zero_core.initialize(make_model(), config(1, 1))
    with pytest.raises(CheckpointError, match="rank_00001.safetensors") as e:
        engine.load_checkpoint(copy)
    assert "\n" not in str(e.value)
    problems = ZbenchSource(copy).verify()
    assert len(problems) == 1 and "rank_00001.safetensors" in problems[0]


def test_bad_paths_and_other_model(saved, tmp_path):
    ckpt, _ = saved
    engine = zero_core.initialize(make_model(), config(1, 1))
    with pytest.raises(CheckpointError, match="tags present: global_step3"):
        engine.load_checkpoint(ckpt, tag="global_step99")
    # a first run's resume, as DeepSpeed's: nothing there, (None, None) and the weights untouched
    before = engine.full_state_dict()
    assert engine.load_checkpoint(tmp_path / "nowhere") == (None, None)
    (tmp_path / "empty").mkdir()
    assert engine.load_checkpoint(tmp_path / "empty") == (None, None)
    assert all(torch.equal(v, before[k]) for k, v in engine.full_state_dict().items())
    with pytest.raises(CheckpointError, match="does not exist"):  # a named tag must be there
        engine.load_checkpoint(tmp_path / "nowhere", tag="global_step3")
    unpointed = tmp_path / "unpointed"  # checkpoints but no 'latest': not a first run, so not silent
    shutil.copytree(ckpt, unpointed)
    (unpointed / "latest").unlink()
    with pytest.raises(CheckpointError, match="no 'latest' file"):
        engine.load_checkpoint(unpointed)
    assert engine.load_checkpoint(unpointed, tag="global_step3")[0] == str(unpointed / "global_step3" / mf.rank_file(0))
    from zbench.models.gpt import GPT, GPTConfig

    other = zero_core.initialize(
        GPT(GPTConfig(vocab_size=37, block_size=16, n_layer=1, n_head=2, n_embd=20)), config(1, 1)
    )
    with pytest.raises(CheckpointError, match="another model"):
        other.load_checkpoint(ckpt)


def test_keep_last_prunes_older_never_latest(tmp_path):
    engine = zero_core.initialize(make_model(), config(2, 1))
    from ckpt_workers import _train

    for step in range(4):
        _train(engine, 0, 1, range(step, step + 1))
        engine.save_checkpoint(tmp_path, keep_last=2)
    assert [t for _, t in fmt.complete_tags(tmp_path)] == ["global_step3", "global_step4"]
    assert fmt.read_latest(tmp_path) == "global_step4"
    manifest = json.loads((tmp_path / "global_step4" / "manifest.json").read_text())
    assert manifest["step"] == 4 and not [d for d in os.listdir(tmp_path) if ".partial" in d]


def test_offline_reshard_to_three_ranks(saved, tmp_path):
    from checkpoints.reshard import reshard_to_zbench

    ckpt, base = saved
    out = reshard_to_zbench(ZbenchSource(ckpt), tmp_path / "r3", 3)
    manifest = mf.read(out)
    assert manifest["world_size"] == 3 and len(manifest["fragments"]) == 3
    assert mf.verify_files(out, manifest) == []
    src = ZbenchSource(tmp_path / "r3")
    for name, t in base["saved_state"].items():
        assert torch.equal(src.load(name), t.float()), name
    # optimizer moments travel too: a resumed engine continues exactly like one loaded from the original
    a = zero_core.initialize(make_model(), config(2, 1))
    a.load_checkpoint(tmp_path / "r3")
    b = zero_core.initialize(make_model(), config(2, 1))
    b.load_checkpoint(ckpt)
    assert (
        torch.equal(a.optimizer.states.exp_avg_sq, b.optimizer.states.exp_avg_sq)
        and float(a.optimizer.states.exp_avg_sq.abs().sum()) > 0
    )
    with pytest.raises(CheckpointError, match="already holds files"):
        reshard_to_zbench(ZbenchSource(ckpt), tmp_path / "r3", 2)


def test_cli_inspect_convert_and_reshard_a_zbench_checkpoint(saved, tmp_path):
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from zbench.cli import main

    ckpt, base = saved
    runner = CliRunner()
    shown = runner.invoke(main, ["inspect", str(ckpt)])
    assert shown.exit_code == 0, shown.output
    assert "zbench" in shown.output and "global_step3" in shown.output
    out = runner.invoke(main, ["convert", str(ckpt), "--to", "fp32", "--out", str(tmp_path / "fp32")])
    assert out.exit_code == 0, out.output
    tensors = load_file(str(tmp_path / "fp32" / "model.safetensors"))
    for name, t in base["saved_state"].items():
        if name != "head.weight":  # tied: stored once, under wte.weight
            assert torch.equal(tensors[name], t.float()), name
    res = runner.invoke(
        main, ["convert", str(ckpt), "--to", "zbench", "--world-size", "3", "--out", str(tmp_path / "r3")]
    )
    assert res.exit_code == 0, res.output
    assert mf.read(fmt.resolve(tmp_path / "r3"))["world_size"] == 3


def test_paths_with_spaces_and_non_ascii(tmp_path):
    from click.testing import CliRunner

    from zbench.cli import main

    root = tmp_path / "mes points de contrôle" / "run 1"
    engine = zero_core.initialize(make_model(), config(2, 1))
    from ckpt_workers import _train

    _train(engine, 0, 1, range(1))
    engine.save_checkpoint(root)
    other = zero_core.initialize(make_model(), config(3, 1))
    other.load_checkpoint(root)
    assert _max_diff(other.full_state_dict(), engine.full_state_dict()) == 0.0
    out = tmp_path / "sortie ü"
    res = CliRunner().invoke(main, ["convert", str(root), "--to", "bf16", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "model.safetensors").is_file()

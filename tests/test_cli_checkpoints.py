"""`zbench convert` / `zbench inspect` end to end on the committed fixtures, and every user error."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from checkpoint_helpers import DCP, DEEPSPEED, UNIVERSAL, flip_element
from checkpoints.deepspeed_pickle import load_pickle
from helpers import cli, one_line_error, refused, snapshot


def _read_output(out):
    """name -> tensor from model.safetensors, resolving recorded aliases."""
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        aliases = {k.removeprefix("alias."): v for k, v in f.metadata().items() if k.startswith("alias.")}
    return {**tensors, **{a: tensors[o] for a, o in aliases.items()}}


@pytest.mark.parametrize("folder", DEEPSPEED, ids=lambda p: p.name)
def test_convert_matches_deepspeed_fp32_consolidation_bitwise(folder, tmp_path):
    result = cli("convert", folder, "--to", "fp32", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    got = _read_output(tmp_path / "out")
    expected = load_file(folder / "expected_fp32.safetensors")
    assert set(got) == set(expected)  # frozen norm.weight and tied head.weight included
    for name, want in expected.items():
        assert torch.equal(got[name], want.float()), name


@pytest.mark.parametrize("folder", UNIVERSAL + DCP, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_convert_universal_and_dcp(folder, tmp_path):
    result = cli("convert", folder, "--to", "fp32", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    got = _read_output(tmp_path / "out")
    ref = (
        folder / "expected_full.safetensors"
        if folder.parent.name == "dcp"
        else (folder.parents[1] / "deepspeed" / folder.name / "expected_fp32.safetensors")
    )
    expected = load_file(ref)
    assert set(got) == set(expected)
    for name, want in expected.items():
        assert torch.equal(got[name], want.float()), name


def test_convert_bf16_sharded(tmp_path):
    folder = next(p for p in DEEPSPEED if p.name == "2_3_bf16")
    result = cli("convert", folder, "--to", "bf16", "--out", tmp_path / "out", "--max-shard-size", "300B")
    assert result.exit_code == 0, result.output
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    model = load_file(folder / "expected_model.safetensors")  # the run's own bf16 weights
    assert set(index["weight_map"]) == set(model) and "head.weight" in model  # the tied alias mapped too
    for name, shard in index["weight_map"].items():
        key = {"head.weight": "emb.weight"}.get(name, name)
        assert torch.equal(load_file(tmp_path / "out" / shard)[key], model[name].to(torch.bfloat16)), (
            name
        )  # fp32 buffer cast too


@pytest.mark.parametrize("folder", DEEPSPEED[::5] + UNIVERSAL[:1] + DCP[:1], ids=lambda p: p.name)
def test_inspect_reports_what_it_is(folder):
    result = cli("inspect", folder, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    kind = {"deepspeed": "deepspeed", "deepspeed_universal": "deepspeed-universal", "dcp": "dcp"}[folder.parent.name]
    assert info["kind"] == kind and info["problems"] == [] and info["tensors"] == 9
    if kind != "dcp":
        stage, world = folder.name.split("_")[:2]
        assert (info["stage"], info["world_size"], info["step"]) == (int(stage), int(world), 2)
    text = cli("inspect", folder).output
    assert "kind" in text and "integrity" in text and "ok" in text.splitlines()[-1]


# -- faults: each is one line naming the problem, non-zero exit, nothing on disk changed -----------------


@pytest.fixture
def ckpt(tmp_path):
    src = next(p for p in DEEPSPEED if p.name == "2_3_bf16")
    shutil.copytree(src, tmp_path / "ck")
    return tmp_path / "ck"


def test_truncated_rank_file(ckpt, tmp_path):
    victim = ckpt / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    victim.write_bytes(victim.read_bytes()[:2000])
    for cmd in (["convert", ckpt, "--to", "fp32", "--out", tmp_path / "out"], ["inspect", ckpt]):
        line = refused(tmp_path, *cmd)
        assert "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt is truncated or corrupt" in line


def _optim_tensor(path, *keys):
    state = load_pickle(path, mmap=False)["optimizer_state_dict"]
    for k in keys:
        state = state[k]
    return state


def test_bit_flipped_master_weights(ckpt, tmp_path):
    victim = ckpt / "global_step2" / "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt"
    flip_element(victim, _optim_tensor(victim, "single_partition_of_fp32_groups", 0), 3)
    line = refused(tmp_path, "convert", ckpt, "--to", "fp32", "--out", tmp_path / "out")
    assert "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt is corrupt" in line and "CRC" in line
    before = snapshot(tmp_path)
    result = cli("inspect", ckpt)
    assert one_line_error(result) and "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt is corrupt" in result.output
    assert "integrity" in result.output and snapshot(tmp_path) == before


def test_bit_flipped_adam_moment_converts_and_inspect_reports(ckpt, tmp_path):
    """Convert checks the records its output is made from; a damaged moment changes no weight, inspect finds it."""
    assert cli("convert", ckpt, "--to", "fp32", "--out", tmp_path / "clean").exit_code == 0
    victim = ckpt / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    flip_element(victim, _optim_tensor(victim, "base_optimizer_state", "state", 0, "exp_avg"), 2)
    result = cli("convert", ckpt, "--to", "fp32", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    written, clean = (tmp_path / d / "model.safetensors" for d in ("out", "clean"))
    assert written.read_bytes() == clean.read_bytes()
    result = cli("inspect", ckpt)
    assert one_line_error(result) and "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt is corrupt" in result.output


def test_missing_rank_file(ckpt, tmp_path):
    (ckpt / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    line = refused(tmp_path, "convert", ckpt, "--to", "fp32", "--out", tmp_path / "out")
    assert "missing rank file" in line and "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt" in line


def test_wrong_tag_lists_the_tags(ckpt, tmp_path):
    line = refused(tmp_path, "convert", ckpt, "--to", "fp32", "--out", tmp_path / "out", "--tag", "global_step9")
    assert "'global_step9'" in line and "tags present: global_step2" in line


def test_not_a_checkpoint_folder(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hello")
    line = refused(tmp_path, "inspect", tmp_path / "notes")
    assert "is not a checkpoint folder" in line and "latest" in line and ".metadata" in line


def test_output_folder_that_holds_files(ckpt, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors").write_text("someone else's")
    line = refused(tmp_path, "convert", ckpt, "--to", "fp32", "--out", tmp_path / "out")
    assert "already holds files" in line


def test_option_errors(ckpt, tmp_path):
    assert "--max-shard-size" in refused(
        tmp_path, "convert", ckpt, "--to", "fp32", "--out", tmp_path / "o", "--max-shard-size", "huge"
    )
    assert "--world-size" in refused(tmp_path, "convert", ckpt, "--to", "zbench", "--out", tmp_path / "o")
    assert "zbench checkpoints only" in refused(
        tmp_path, "convert", ckpt, "--to", "zbench", "--out", tmp_path / "o", "--world-size", "2"
    )
    assert "not dcp" in refused(tmp_path, "inspect", ckpt, "--from", "dcp")


@pytest.mark.parametrize("to", ["fp32", "zbench"])
def test_ctrl_c_after_the_output_is_published_says_it_is_complete(tmp_path, monkeypatch, to):
    from fault_workers import tiny_checkpoint

    src = tiny_checkpoint(tmp_path / "ck")

    def interrupted(*args, **kwargs):  # Ctrl-C as the summary line is printed, the output in place
        raise KeyboardInterrupt

    monkeypatch.setattr("click.echo", interrupted)
    ranks = ["--world-size", 1] if to == "zbench" else []
    result = cli("convert", src, "--to", to, "--out", tmp_path / "out", *ranks)
    assert result.exit_code == 130
    assert result.output.strip().splitlines() == [f"Error: interrupted (Ctrl-C) after zbench convert finished: "
                                                  f"{tmp_path / 'out'}{'/global_step1' if to == 'zbench' else ''} "
                                                  "is complete; nothing to redo"]
    assert (tmp_path / "out").is_dir()

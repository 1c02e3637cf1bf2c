"""`zero_core.deepspeed.utils.zero_to_fp32` as scripts call DeepSpeed's after training: on real DeepSpeed 0.19.8
checkpoints (tests/fixtures/deepspeed/, with DeepSpeed's own zero_to_fp32 output beside each) and on zero_core's
own, with the same readers as `zbench convert`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from parity_workers import ds_config, make_batches, make_model
from safetensors.torch import load_file

import zero_core.deepspeed as deepspeed
from checkpoints.source import CheckpointError
from zero_core.deepspeed.utils.zero_to_fp32 import (
    convert_zero_checkpoint_to_fp32_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
)

DS = Path(__file__).parent / "fixtures" / "deepspeed"


@pytest.mark.parametrize("case", ["1_2_bf16", "2_3_fp32", "3_2_bf16", "3_3_fp32"])  # stage_ranks_dtype
def test_deepspeed_checkpoints_give_deepspeeds_own_fp32_weights(case):
    want = load_file(DS / case / "expected_fp32.safetensors")
    got = get_fp32_state_dict_from_zero_checkpoint(DS / case)  # the parent: `latest` names the tag
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], tensor), name
    assert set(want) <= set(got)


def test_zero_core_checkpoints_round_trip_and_load_into_a_model(tmp_path):
    cfg = ds_config(3, "bf16", 2)
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for x, y in make_batches(2, 2):
        engine.backward(engine(x, y).loss)
        engine.step()
    engine.save_checkpoint(tmp_path / "ckpt")
    trained = engine.full_state_dict()
    engine.close()
    got = get_fp32_state_dict_from_zero_checkpoint(tmp_path / "ckpt")
    assert got.keys() == trained.keys() and all(torch.equal(got[k], v) for k, v in trained.items())
    fresh = load_state_dict_from_zero_checkpoint(make_model(), tmp_path / "ckpt")
    for name, p in fresh.state_dict().items():
        assert torch.equal(p, trained[name].to(p.dtype)), name
    files = convert_zero_checkpoint_to_fp32_state_dict(tmp_path / "ckpt", tmp_path / "out", safe_serialization=True)
    written = {k: v for f in files if f.suffix == ".safetensors" for k, v in load_file(f).items()}
    assert all(torch.equal(written[k], trained[k]) for k in written) and written
    convert_zero_checkpoint_to_fp32_state_dict(tmp_path / "ckpt", tmp_path / "bin")  # DeepSpeed's default: a .bin
    written = torch.load(tmp_path / "bin" / "pytorch_model.bin", weights_only=True)
    assert written.keys() == trained.keys() and all(torch.equal(written[k], v) for k, v in trained.items())


# DeepSpeed 0.19.8's convert_zero_checkpoint_to_fp32_state_dict on fixtures/deepspeed/1_2_bf16 with
# max_shard_size=500: the files it writes and its index's total size (the tied head.weight counted once)
DS_SHARDED_FILES = ["pytorch_model-00001-of-00003.bin", "pytorch_model-00002-of-00003.bin",
                    "pytorch_model-00003-of-00003.bin", "pytorch_model.bin.index.json"]
DS_TOTAL_SIZE = 1196


def test_the_default_output_is_deepspeeds_pytorch_model_bin(tmp_path):
    want = load_file(DS / "1_2_bf16" / "expected_fp32.safetensors")  # DeepSpeed's own zero_to_fp32 output
    files = convert_zero_checkpoint_to_fp32_state_dict(DS / "1_2_bf16", tmp_path / "out")
    assert files == [tmp_path / "out" / "pytorch_model.bin"] and sorted(p.name for p in (tmp_path / "out").iterdir()) \
        == ["pytorch_model.bin"]
    got = torch.load(files[0], weights_only=True)  # plain tensors only
    assert set(want) <= set(got) and all(torch.equal(got[k], v) for k, v in want.items())
    convert_zero_checkpoint_to_fp32_state_dict(DS / "1_2_bf16", tmp_path / "sharded", max_shard_size=500)
    assert sorted(p.name for p in (tmp_path / "sharded").iterdir()) == DS_SHARDED_FILES
    index = json.loads((tmp_path / "sharded" / "pytorch_model.bin.index.json").read_text())
    frozen = 4 * got["norm.weight"].numel()  # the frozen weight DeepSpeed's output leaves out and zero_core writes
    assert index["metadata"] == {"total_size": DS_TOTAL_SIZE + frozen} and index["weight_map"].keys() == got.keys()
    shards = {f: torch.load(tmp_path / "sharded" / f, weights_only=True) for f in DS_SHARDED_FILES[:-1]}
    assert all(torch.equal(shards[f][k], got[k]) for k, f in index["weight_map"].items())
    head = shards[index["weight_map"]["head.weight"]]
    assert head["head.weight"].data_ptr() == head["emb.weight"].data_ptr()  # tied: one tensor, saved once


def test_a_folder_without_a_checkpoint_is_one_line(tmp_path):
    with pytest.raises(CheckpointError) as e:
        get_fp32_state_dict_from_zero_checkpoint(tmp_path)
    assert "\n" not in str(e.value)


def test_lazy_mode_is_refused_in_one_line():
    with pytest.raises(CheckpointError) as e:
        get_fp32_state_dict_from_zero_checkpoint(DS / "1_2_bf16", lazy_mode=True)
    assert "lazy_mode" in str(e.value) and "zbench convert" in str(e.value) and "\n" not in str(e.value)


def test_an_output_folder_with_files_is_kept_and_named_as_the_argument(tmp_path):
    """DeepSpeed would write over the files; zero_core keeps them and names its own argument, not a CLI flag."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError) as e:
        convert_zero_checkpoint_to_fp32_state_dict(DS / "1_2_bf16", out)
    assert "output_dir" in str(e.value) and "--out" not in str(e.value)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_an_output_path_holding_the_cli_flags_text_is_named_as_given(tmp_path):
    """The refusals name the argument (`output_dir`) by parameter, so a path that itself holds "--out" is shown
    unchanged."""
    out = tmp_path / "run--out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError) as e:
        convert_zero_checkpoint_to_fp32_state_dict(DS / "1_2_bf16", out)
    assert str(e.value) == f"output folder {out} already holds files; pass an empty or new output_dir"
    (tmp_path / "--out").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError) as e:
        convert_zero_checkpoint_to_fp32_state_dict(DS / "1_2_bf16", tmp_path / "--out")
    assert str(e.value).startswith(f"output_dir {tmp_path / '--out'} is a symbolic link"), str(e.value)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and not (tmp_path / "elsewhere").exists()


@pytest.mark.slow  # seconds of subprocess launches: the full suite runs it
def test_every_output_refusal_names_the_argument_it_is_given(tmp_path):
    from checkpoints.output_claim import check_output, staging_dir

    (tmp_path / "a file").write_text("x")
    (tmp_path / "src").mkdir()
    staging_dir(tmp_path / "taken").mkdir()  # a staging folder no convert owns
    outs = [tmp_path / ("n" * 300), tmp_path / "..", tmp_path / "a file", tmp_path / "src" / "o", tmp_path / "src",
            tmp_path / "taken"]
    for out in outs:
        for name in ("--out", "output_dir"):
            with pytest.raises(CheckpointError) as e:
                check_output(out, protect=[tmp_path / "src"], name=name)
            other = "output_dir" if name == "--out" else "--out"
            assert name in str(e.value) and other not in str(e.value), str(e.value)

"""pretrained= and config paths: links followed by one rule (inside the folder, or a hub cache's models--*/
folder) for sharded and single-file weights; deep JSON and odd config paths are one-line refusals."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch
from safetensors.torch import save_file

import zero_core
from checkpoints.hf_folder import check_hf_config
from checkpoints.source import CheckpointError
from zero_core.config_errors import ConfigError

CFG = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))


def _hub_snapshot(tmp_path, sd):
    """A huggingface_hub cache layout: snapshots/REV/* link to ../../blobs/<sha256>."""
    repo = tmp_path / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    shards = {"model-00001-of-00002.safetensors": ["0.weight", "0.bias"],
              "model-00002-of-00002.safetensors": ["1.weight", "1.bias"]}

    def blob(name, write):
        tmp = blobs / "tmp"
        write(tmp)
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        os.rename(tmp, blobs / digest)
        os.symlink(f"../../blobs/{digest}", snap / name)

    for f, keys in shards.items():
        blob(f, lambda p, keys=keys: save_file({k: sd[k] for k in keys}, str(p)))
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    blob("model.safetensors.index.json", lambda p: p.write_text(json.dumps(index)))
    return snap


def test_a_hub_cache_snapshot_loads(tmp_path):
    want = _model(3).state_dict()
    snap = _hub_snapshot(tmp_path, want)
    fresh = _model(99)
    zero_core.initialize(fresh, CFG, pretrained=str(snap))
    assert all(torch.equal(a, want[k]) for k, a in fresh.state_dict().items())


@pytest.mark.parametrize("sharded", [False, True])
def test_links_leaving_the_folder_are_refused_alike(tmp_path, sharded):
    sd = _model(3).state_dict()
    outside, folder = tmp_path / "outside", tmp_path / "snap"
    outside.mkdir()
    folder.mkdir()
    save_file(sd, str(outside / "blob"))
    if sharded:
        os.symlink(outside / "blob", folder / "model-00001-of-00001.safetensors")
        index = {"weight_map": {k: "model-00001-of-00001.safetensors" for k in sd}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        os.symlink(outside / "blob", folder / "model.safetensors")
    with pytest.raises(ValueError, match="outside") as e:
        zero_core.initialize(_model(99), CFG, pretrained=str(folder))
    assert "cp -rL" in str(e.value) and "--follow-symlinks" not in str(e.value)


def test_a_link_inside_the_folder_is_followed(tmp_path):
    want = _model(3).state_dict()
    save_file(want, str(tmp_path / "real.safetensors"))
    os.symlink("real.safetensors", tmp_path / "model.safetensors")
    fresh = _model(99)
    zero_core.initialize(fresh, CFG, pretrained=str(tmp_path))
    assert all(torch.equal(a, want[k]) for k, a in fresh.state_dict().items())


def _deep(n: int = 100000) -> str:
    return "[" * n + "]" * n


def test_deeply_nested_index_and_hf_config_are_one_line_refusals(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(_deep())
    with pytest.raises(ValueError, match="nested too deeply"):
        zero_core.initialize(_model(1), CFG, pretrained=str(tmp_path))
    (tmp_path / "config.json").write_text(_deep())
    with pytest.raises(CheckpointError, match="nested too deeply"):
        check_hf_config(tmp_path / "config.json")


def test_init_context_reads_a_config_path_like_initialize(tmp_path):
    fifo = tmp_path / "cfg.fifo"
    os.mkfifo(fifo)
    dup = tmp_path / "dup.json"
    dup.write_text('{"zero_optimization": {"stage": 3}, "zero_optimization": {"stage": 1}}')
    for path, words in ((fifo, "not a regular file"), (tmp_path / "none.json", "does not exist"), (dup, "twice")):
        with pytest.raises(ConfigError, match=words):
            with zero_core.init_context(str(path)):
                pass

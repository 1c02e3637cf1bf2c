"""A zbench checkpoint and its surroundings as an attacker or a careless user leaves them: a FIFO where the
manifest's checksum should be, Hugging Face files that are links (as in HF's cache), a copy that fails after the
weights were written, `--out .` or a link, a 1-rank save resharded for 2 ranks, a tag that names the pointer
file. Each is one `Error:` line with nothing left behind, or the right output."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import pytest
import torch
from fault_workers import tiny_checkpoint
from helpers import REPO, cli, one_line_error, read_command, refused

from checkpoints import manifest as mf
from checkpoints.zbench_source import ZbenchSource


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt")


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_a_fifo_for_the_manifests_checksum_is_refused_not_waited_on(ckpt, tmp_path, command):
    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy)
    checksum = next(copy.glob(f"*/{mf.CHECKSUM}"))
    checksum.unlink()
    os.mkfifo(checksum)
    args = map(str, read_command(command, copy, tmp_path / "out"))
    done = subprocess.run([sys.executable, "-m", "zbench.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)  # a reader that waits on the FIFO fails here instead of hanging the suite
    assert "not a regular file" in one_line_error(done)
    assert not (tmp_path / "out").exists()


def _hf_layout(ckpt, tmp_path):
    """ckpt inside a Hugging Face layout whose config and tokenizer are links into a blob folder (HF's cache)."""
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "config").write_text('{"model_type": "gpt2"}')
    (tmp_path / "blobs" / "tok").write_text("{}")
    hf = tmp_path / "hf"
    shutil.copytree(ckpt, hf / "ckpt")
    os.symlink("../blobs/config", hf / "config.json")
    os.symlink("../blobs/tok", hf / "tokenizer.json")
    return hf / "ckpt"


def test_hf_files_that_are_links_are_refused_before_writing_or_followed_when_asked(ckpt, tmp_path):
    src = _hf_layout(ckpt, tmp_path)
    (hf := src.parent / "generation_config.json").write_text("{}")  # a plain file beside the links
    out = tmp_path / "out"
    line = refused(tmp_path, "convert", src, "--to", "fp32", "--out", out, "--hf-config", hf)
    assert "config.json is a symbolic link" in line and "--follow-symlinks" in line and not out.exists()
    (src.parent / "config.json").unlink()
    (src.parent / "config.json").write_text('{"model_type": "gpt2"}')  # a real config, a linked tokenizer
    line = refused(tmp_path, "convert", src, "--to", "fp32", "--out", out)
    assert "tokenizer.json is a symbolic link" in line and not out.exists()
    result = cli("convert", src, "--to", "fp32", "--out", out, "--follow-symlinks")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                     "tokenizer.json"]


def test_a_copy_that_fails_after_the_weights_were_written_takes_them_back(ckpt, tmp_path, monkeypatch):
    src = _hf_layout(ckpt, tmp_path)
    real_copy = shutil.copyfile

    def full_disk(a, b, *args, **kwargs):
        if str(b).endswith("tokenizer.json"):
            real_copy(a, b)  # the file is begun, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_copy(a, b, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", full_disk)
    line = one_line_error(cli("convert", src, "--to", "fp32", "--out", tmp_path / "out", "--follow-symlinks"))
    assert "no space" in line.lower() and "nothing was written" in line
    assert not (tmp_path / "out").exists()
    (tmp_path / "empty").mkdir()  # an empty --out given by the user stays, emptied of what was written
    one_line_error(cli("convert", src, "--to", "fp32", "--out", tmp_path / "empty", "--follow-symlinks"))
    assert list((tmp_path / "empty").iterdir()) == []


def test_out_that_is_dot_or_a_link_is_refused_before_any_work(ckpt, tmp_path, monkeypatch):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert "'.' or '..'" in refused(tmp_path, "convert", ckpt, "--to", "fp32", "--out", ".")
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "link")
    assert "is a symbolic link" in refused(tmp_path, "convert", ckpt, "--to", "fp32", "--out", tmp_path / "link")


def test_a_one_rank_save_resharded_for_two_ranks_is_split(ckpt, tmp_path):
    result = cli("convert", ckpt, "--to", "zbench", "--world-size", "2", "--out", tmp_path / "r2")
    assert result.exit_code == 0, result.output
    source, resharded = ZbenchSource(ckpt), ZbenchSource(tmp_path / "r2")
    manifest = resharded.manifest
    assert source.manifest["stage"] > 0 and source.manifest["layout"]["world_size"] == 1
    assert manifest["layout"]["world_size"] == 2 and len(manifest["fragments"]) == 2
    assert resharded.verify() == []
    for info in source.params():
        assert torch.equal(resharded.load(info.name), source.load(info.name)), info.name


def test_a_tag_that_names_the_pointer_file_is_refused(tmp_path):
    import zero_core
    from checkpoints.source import CheckpointError
    from ckpt_workers import config
    from parity_workers import make_model

    engine = zero_core.initialize(make_model(), config(2, 1))
    for tag in ("latest", "zero_to_fp32.py"):  # the pointer, and the script a DeepSpeed-API engine leaves
        with pytest.raises(CheckpointError, match="pointer file"):
            engine.save_checkpoint(tmp_path, tag=tag)
    assert list(tmp_path.iterdir()) == []

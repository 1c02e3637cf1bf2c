"""A DCP folder written through a stream transform (`FileSystemWriter(_extensions=[ZStandard()])`: each chunk
compressed, its descriptor `stream.zstd/1` in `.metadata`) that this machine cannot decode is refused up front in one
line naming the package to install, not reported as a damaged file; one whose transform torch does not know is
refused naming the torch that saved it. The folders are the model_optim fixture with descriptors written into its
`.metadata` (the fix is what matters: nothing is decoded before the refusal)."""

from __future__ import annotations

import pickle
import shutil

import pytest

import torch.distributed.checkpoint._extension as extension
from checkpoint_helpers import DCP
from checkpoints.dcp_metadata import read_metadata
from checkpoints.dcp_source import DcpSource
from checkpoints.source import CheckpointError
from helpers import read_command, refused

MODEL_OPTIM = next(p for p in DCP if p.name == "model_optim")


def _described(tmp_path, descriptor: str):
    folder = tmp_path / "src" / "ck"
    shutil.copytree(MODEL_OPTIM, folder)
    md = read_metadata(folder)
    for info in md.storage_data.values():
        info.transform_descriptors = [descriptor]
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    return folder


@pytest.fixture
def no_zstd(monkeypatch):
    """A machine without zstandard or pyzstd, as torch sees it."""
    monkeypatch.setattr(extension, "zstandard", None)
    monkeypatch.setattr(extension, "pyzstd", None)


def test_compressed_chunks_without_their_package_name_it(tmp_path, no_zstd):
    folder = _described(tmp_path, "stream.zstd/1")
    with pytest.raises(CheckpointError) as e:
        DcpSource(folder)
    line = str(e.value)
    assert "'stream.zstd/1'" in line and line.endswith("install it: pip install zstandard") and "\n" not in line


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_the_cli_says_what_to_install_and_writes_nothing(tmp_path, no_zstd, command):
    folder = _described(tmp_path, "stream.zstd/1")
    line = refused(tmp_path, *read_command(command, folder, tmp_path / "out"))
    assert "pip install zstandard" in line and "copy the folder again" not in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("descriptor, words", [
    ("stream.rot13/1", "which this torch does not know"),
    ("stream.zstd/9", "convert it with the torch version that saved it"),
])
def test_a_transform_torch_cannot_apply_is_named(tmp_path, descriptor, words):
    folder = _described(tmp_path, descriptor)
    with pytest.raises(CheckpointError) as e:
        DcpSource(folder)
    assert repr(descriptor) in str(e.value) and words in str(e.value) and "\n" not in str(e.value)

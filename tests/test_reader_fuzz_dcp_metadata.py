"""A DCP folder whose `.metadata` disagrees with its chunks, or is gone, as a careless copy or a crafted file
leaves it: a tensor's dtype changed (DCP's reader casts the torch.save'd float32 chunk into what `.metadata`
says, bool or float8, without a word), a chunk file name longer than any file system takes (the OS refused the
look-up with an OSError that reached `load_checkpoint` as a traceback), or `.metadata` missing beside the chunk
files, or a folder in its place (`load_checkpoint` took the folder for a first run's empty one and loaded
nothing). Each is one line and changes nothing."""

from __future__ import annotations

import pickle
import shutil

import pytest
import torch
from test_deepspeed_resume import _engine

from checkpoint_helpers import DCP
from checkpoints.dcp_metadata import read_metadata
from checkpoints.dcp_source import DcpSource
from checkpoints.source import CheckpointError
from helpers import one_line_error, read_command, zbench

MODEL_OPTIM = next(p for p in DCP if p.name == "model_optim")


def _crafted(tmp_path, change):
    folder = tmp_path / "ck"
    shutil.copytree(MODEL_OPTIM, folder, ignore=shutil.ignore_patterns("expected*", "continued*"))
    md = read_metadata(folder)
    change(md)
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    return folder


def _dtype(dtype):
    return lambda md: setattr(md.state_dict_metadata["model.lin1.weight"].properties, "dtype", dtype)


def _long_name(md):
    index = next(i for i in md.storage_data if i.fqn == "model.lin1.weight")
    info = md.storage_data[index]
    md.storage_data[index] = type(info)("x" * 5000, info.offset, info.length)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float8_e4m3fn])
def test_a_dtype_the_chunk_does_not_hold_is_named(tmp_path, dtype):
    folder = _crafted(tmp_path, _dtype(dtype))
    assert DcpSource(MODEL_OPTIM).verify() == []
    problems = DcpSource(folder).verify()  # lin1.weight is split over both ranks' files
    assert problems and all(".distcp is corrupt: the chunk at byte" in p for p in problems), problems


def test_convert_refuses_it_and_writes_nothing(tmp_path):
    folder = _crafted(tmp_path, _dtype(torch.bool))
    line = one_line_error(zbench(*map(str, read_command("convert", folder, tmp_path / "out"))))
    assert ".distcp is corrupt" in line and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


@pytest.mark.parametrize("craft", ["dtype", "long name", "no .metadata", "a folder for .metadata"])
def test_load_checkpoint_is_one_line_and_loads_nothing(tmp_path, craft):
    if "metadata" in craft:
        folder = tmp_path / "ck"
        shutil.copytree(MODEL_OPTIM, folder)
        (folder / ".metadata").unlink()
        if craft == "a folder for .metadata":
            (folder / ".metadata").mkdir()
    else:
        folder = _crafted(tmp_path, _dtype(torch.bool) if craft == "dtype" else _long_name)
    engine = _engine(2)
    before = engine.full_state_dict()
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(folder)
    words = {"dtype": ".distcp is corrupt", "long name": "longer than 255 bytes"}
    assert words.get(craft, "no .metadata file") in str(e.value) and "\n" not in str(e.value)
    assert all(torch.equal(v, engine.full_state_dict()[k]) for k, v in before.items())
    engine.close()

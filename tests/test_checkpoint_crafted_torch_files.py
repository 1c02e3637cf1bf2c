"""Copies of the DeepSpeed fixtures rewritten at the torch.save level: a file of the other byte order is read with
its bytes swapped, expanded (stride-0) views past a bound, pickles that BUILD state onto containers, and frozen
parameters with no data are each refused in one line by inspect and convert."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from checkpoints.deepspeed_pickle import load_pickle
from checkpoints.source import CheckpointError
from checkpoints.torch_file_reader import TorchFileReader
from helpers import FIXTURES, cli, refused, rewrite_torch_zip

MODEL = "mp_rank_00_model_states.pt"


_rewrite = rewrite_torch_zip


def _as_big_endian(path: Path) -> None:
    """`path` (float32 storages only) as a big-endian machine writes it: each element's bytes reversed."""

    def change(name: str, data: bytes) -> bytes:
        if name.endswith("/byteorder"):
            return b"big"
        if "/data/" in name and not name.endswith(".pkl") and "serialization" not in name:
            return np.frombuffer(data, dtype="<f4").astype(">f4").tobytes()
        return data

    _rewrite(path, change)


def _copy(tmp_path: Path, kind: str, name: str) -> Path:
    shutil.copytree(FIXTURES / kind / name, tmp_path / name)
    return tmp_path / name


def _converted(root: Path, out: Path) -> dict[str, torch.Tensor]:
    result = cli("convert", root, "--to", "fp32", "--out", out)
    assert result.exit_code == 0, result.output
    return load_file(out / "model.safetensors")


def test_a_big_endian_file_reads_swapped(tmp_path):
    path = next((FIXTURES / "deepspeed_universal" / "3_2_fp32").rglob("zero/lin1.weight/fp32.pt"))
    big = tmp_path / "fp32.pt"
    shutil.copy(path, big)
    _as_big_endian(big)
    reader, theirs = TorchFileReader(), TorchFileReader()
    got = reader.tensor(big, reader.get(big))
    assert torch.equal(got, theirs.tensor(path, theirs.get(path))) and got.abs().sum() > 0
    assert reader.problems() == []


def test_a_big_endian_universal_checkpoint_converts(tmp_path):
    root = _copy(tmp_path, "deepspeed_universal", "3_2_fp32")
    want = _converted(root, tmp_path / "little")
    for path in root.rglob("zero/*/fp32.pt"):
        _as_big_endian(path)
    assert "integrity          ok" in cli("inspect", root).output
    got = _converted(root, tmp_path / "big")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def _resave_module(path: Path, **entries) -> None:
    state = load_pickle(path, mmap=False)
    state["module"].update(entries)
    torch.save(state, path)


def test_an_expanded_view_past_the_bound_is_refused(tmp_path):
    root = _copy(tmp_path, "deepspeed", "2_2_fp32")
    _resave_module(root / "global_step2" / MODEL, mix=torch.zeros(1).expand(2**40))  # 4 bytes on disk, 4 TiB out
    line = refused(tmp_path, "convert", root, "--to", "fp32", "--out", tmp_path / "out")
    assert MODEL in line and "expanded view of 1 stored elements" in line and ".clone()" in line, line


def test_small_expanded_views_read_whole(tmp_path):
    """Position ids (`arange(n).expand(1, -1)`) and small broadcast constants are read at their full size."""
    path = tmp_path / "views.pt"
    state = {"ids": torch.arange(8).expand(4, 8), "ones": torch.ones(1).expand(1000)}
    state["big"] = torch.zeros(1).expand(2**40)
    torch.save(state, path)
    reader = TorchFileReader()
    meta = reader.get(path)
    for key in ("ids", "ones"):
        assert torch.equal(reader.tensor(path, meta[key]), state[key]), key
    with pytest.raises(CheckpointError, match=r"expanded view .*16x its storage"):
        reader.tensor(path, meta["big"])


# BUILD with a dict state onto objects that have no __dict__: torch's unpickler fails inside its own code
BUILDS = {
    "set": b"\x80\x02cbuiltins\nset\n)\x81}(X\x01\x00\x00\x00aK\x01ub.",
    "size": b"\x80\x02ctorch\nSize\n((K\x01tt\x81}(X\x01\x00\x00\x00aK\x01ub.",
}


@pytest.mark.parametrize("kind", sorted(BUILDS))
def test_build_onto_a_container_is_corrupt(tmp_path, kind):
    root = _copy(tmp_path, "deepspeed", "2_2_fp32")
    path = root / "global_step2" / MODEL
    _rewrite(path, lambda name, data: BUILDS[kind] if name.endswith("/data.pkl") else data)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_pickle(path)
    for args in (("inspect", root), ("convert", root, "--to", "fp32", "--out", tmp_path / "out")):
        line = refused(tmp_path, *args)
        assert f"{path} is truncated or corrupt" in line, line


@pytest.mark.parametrize("name, file", [("2_2_fp32", MODEL), ("3_2_fp32", "zero_pp_rank_0_" + MODEL)])
def test_a_frozen_parameter_without_data_is_refused(tmp_path, name, file):
    root = _copy(tmp_path, "deepspeed", name)
    path = root / "global_step2" / file
    state = load_pickle(path, mmap=False)
    assert "norm.weight" in state["frozen_param_shapes"]
    del state["frozen_param_fragments"]["norm.weight"]
    state["module"].pop("norm.weight", None)
    torch.save(state, path)
    for args in (("inspect", root), ("convert", root, "--to", "fp32", "--out", tmp_path / "out")):
        line = refused(tmp_path, *args)
        assert "frozen parameter 'norm.weight'" in line and "frozen_param_fragments" in line, line

"""A checkpoint file with bytes its format does not describe, left by whoever rewrote it: bytes after a safetensors
file's last tensor (its manifest's size and checksum made to match), a gap between two tensors, bytes after a
DeepSpeed file's zip archive or after a DCP file's last chunk. Each format says the file ends where its data does
(safetensors' own reader refuses the rest), so each is one line naming the file as damaged or altered, from
`inspect`, `convert` and `load_checkpoint` alike, before anything is written or changed."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch
from ckpt_workers import config
from fault_workers import tiny_checkpoint
from helpers import FIXTURES, read_command, refused
from parity_workers import make_model

from checkpoints import checksums
from checkpoints import manifest as mf
from checkpoints.safetensors_read import header_problem
from checkpoints.source import CheckpointError

EXTRA = b"EVIL" * 16  # 64 bytes


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt")


def _padded(ckpt, tmp_path, name: str):
    """A copy of `ckpt` whose file `name` has 64 bytes appended, its manifest's size and checksum rewritten to match
    (and the manifest's own checksum): only the file's own format can tell."""
    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy)
    tag = next(p for p in copy.iterdir() if p.is_dir())
    with open(tag / name, "ab") as f:
        f.write(EXTRA)
    manifest = json.loads((tag / mf.MANIFEST).read_text())
    manifest["files"][name] = checksums.file_record(tag / name)
    mf.write(tag, manifest)
    return copy, tag


@pytest.mark.parametrize("command", ["inspect", "convert"])
@pytest.mark.parametrize("name", [mf.rank_file(0), mf.FROZEN_FILE])
def test_bytes_after_a_safetensors_files_tensors_are_refused(ckpt, tmp_path, name, command):
    copy, tag = _padded(ckpt, tmp_path, name)
    line = refused(tmp_path, *read_command(command, copy, tmp_path / "out"))
    assert f"{tag / name} is not a valid safetensors file" in line, line
    assert "64 bytes follow the last tensor's data: the file was damaged or altered" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", [mf.rank_file(0), mf.FROZEN_FILE])
def test_load_checkpoint_refuses_them_before_any_change(ckpt, tmp_path, name):
    import zero_core

    copy, tag = _padded(ckpt, tmp_path, name)
    engine = zero_core.initialize(make_model(), config(2, 1))
    before = engine.full_state_dict()
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(copy)
    assert str(e.value).startswith(f"{tag / name} is not a valid safetensors file (64 bytes follow"), e.value
    assert "\n" not in str(e.value)
    after = engine.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def _safetensors(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize("case", ["gap", "trailing"])
def test_data_the_header_does_not_cover_is_refused_as_safetensors_refuses_it(tmp_path, case):
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16] if case == "gap" else [8, 12]}}
    data = bytes(16)
    problem = header_problem(header, len(data))
    words = "4 bytes at data offset 8 belong to no tensor" if case == "gap" else "4 bytes follow the last tensor's"
    assert problem is not None and words in problem and "damaged or altered" in problem, problem
    path = tmp_path / "x.safetensors"
    path.write_bytes(_safetensors(header, data))
    from safetensors import safe_open

    with pytest.raises(Exception, match="not fully covered|invalid offset|InvalidOffset"):  # the format's own reader
        safe_open(str(path), "pt")
    header["b"]["data_offsets"] = [8, 12]
    assert header_problem(header, 12) is None  # back to back, ending with the file: sound


@pytest.mark.parametrize("command", ["inspect", "convert"])
@pytest.mark.parametrize("name", ["zero_pp_rank_1_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt"])
def test_bytes_after_a_deepspeed_files_zip_archive_are_refused(tmp_path, name, command):
    copy = tmp_path / "ds"
    shutil.copytree(FIXTURES / "deepspeed" / "2_2_fp32", copy)
    path = copy / "global_step2" / name
    with open(path, "ab") as f:  # torch.load and DeepSpeed's zero_to_fp32 read the file as before
        f.write(EXTRA)
    line = refused(tmp_path, *read_command(command, copy, tmp_path / "out"))
    assert f"{path} is truncated or corrupt (64 bytes follow its zip archive's end: the file was damaged or " \
           "altered)" in line, line


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_bytes_after_a_dcp_files_last_chunk_are_refused(tmp_path, command):
    copy = tmp_path / "dcp"
    shutil.copytree(FIXTURES / "dcp" / "plain", copy)
    with open(copy / "__1_0.distcp", "ab") as f:
        f.write(EXTRA)
    line = refused(tmp_path, *read_command(command, copy, tmp_path / "out"))
    assert f"{copy / '__1_0.distcp'} holds 64 bytes after its last chunk: it was damaged or altered" in line, line


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_bytes_after_a_dcp_metadata_pickle_are_refused(tmp_path, command):
    copy = tmp_path / "dcp"
    shutil.copytree(FIXTURES / "dcp" / "plain", copy)
    with open(copy / ".metadata", "ab") as f:  # pickle stops reading at its end: torch's DCP reader takes it
        f.write(EXTRA)
    line = refused(tmp_path, *read_command(command, copy, tmp_path / "out"))
    assert f"{copy / '.metadata'} holds 64 bytes after its pickle: it was damaged or altered" in line, line

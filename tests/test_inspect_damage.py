"""`zbench inspect` tells what a checkpoint is and which damage it has, truly: a torch.save zip whose directory
names were damaged (no CRC covers them), what a DCP checkpoint can and cannot say about its tensors, and a DCP
`.metadata` that claims more than its data files hold."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

from checkpoint_helpers import DEEPSPEED, UNIVERSAL
from checkpoints.dcp_source import DcpSource
from checkpoints.source import CheckpointError
from helpers import cli, read_command, refused
from test_checkpoint_crafted_dcp import MODEL_OPTIM, crafted_copy



def damage_name(path: Path, record: str, at: int, central: bool = True) -> None:
    """Flip a bit of character `at` of `record`'s name where the zip's central directory lists it (else in its
    local header): a byte no CRC covers."""
    data = bytearray(path.read_bytes())
    name = next(n for n in _names(path) if n.endswith(record)).encode()
    where = data.rfind(name) if central else data.find(name)
    assert where >= 0 and data.count(name) == 2, name
    data[where + at % len(name)] ^= 0x10
    path.write_bytes(bytes(data))


def _names(path: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(path) as zf:
        return zf.namelist()


def _universal_copy(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "univ"
    shutil.copytree(UNIVERSAL[0], folder)
    return folder, sorted(folder.glob("global_step*_universal/zero/*/fp32.pt"))[0]


def _deepspeed_copy(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "ds"
    shutil.copytree(next(p for p in DEEPSPEED if p.name == "2_2_fp32"), folder)
    return folder, sorted(folder.glob("global_step*/*optim_states.pt"))[0]


DAMAGES = {  # (where, character, central directory?) -> what the line says about the record
    "the folder of a name": ("byteorder", 0, True, "lies outside the archive's folder"),
    "the end of a name": ("byteorder", -1, True, "is named"),
    "a local header's name": ("data.pkl", -2, False, "is named"),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
@pytest.mark.parametrize("copy", [_universal_copy, _deepspeed_copy], ids=["universal fp32.pt", "ZeRO optim states"])
def test_a_damaged_record_name_is_reported_by_inspect_and_refused_by_convert(tmp_path, copy, damage):
    record, at, central, said = DAMAGES[damage]
    folder, victim = copy(tmp_path)
    damage_name(victim, record, at, central)
    result = cli("inspect", folder)
    assert "integrity ok" not in " ".join(result.output.split()), result.output
    line = refused(tmp_path, "inspect", folder)
    assert str(victim) in line and said in line and record[:-2] in line, line
    line = refused(tmp_path, "convert", folder, "--to", "fp32", "--out", tmp_path / "out")
    assert str(victim) in line and said in line and "enforce fail" not in line, line
    assert not (tmp_path / "out").exists()


def _save(folder: Path, state: dict) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group": one process saves everything
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)


def test_dcp_inspect_says_what_the_format_records_about_its_tensors(tmp_path):
    """DCP saves a buffer, a frozen parameter and a trained one alike: inspect does not claim "0 frozen or
    buffers", and counts the tensors that have optimizer states instead."""
    model = {"w": torch.randn(3, 4), "frozen": torch.randn(2), "running_mean": torch.zeros(4)}
    states = {"w": {"step": torch.tensor(3.0), "exp_avg": torch.zeros(3, 4), "exp_avg_sq": torch.zeros(3, 4)}}
    _save(tmp_path / "ck", {"model": model, "optim": {"state": states}})
    result = cli("inspect", tmp_path / "ck")
    assert result.exit_code == 0, result.output
    rows = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in result.output.splitlines()}
    assert rows["tensors"] == "3 (a dcp checkpoint does not record which are tied, frozen or buffers)"
    assert rows["optimizer states"] == "for 1 of 3 tensors" and rows["elements"] == "18 (all counted)"
    assert "frozen or buffers)" not in result.output.replace("does not record which are tied, frozen or buffers", "")
    summary = json.loads(cli("inspect", tmp_path / "ck", "--json").output)
    assert summary["extra"]["optimizer states"] == "for 1 of 3 tensors" and summary["tensors"] == 3
    rows = cli("inspect", UNIVERSAL[-1]).output  # formats that record roles still count them
    assert "tied, " in rows and "frozen or buffers)" in rows and "(tied counted once)" in rows


def _huge(entry) -> None:
    entry.size = torch.Size([2**40])
    entry.chunks = [ChunkStorageMetadata(torch.Size([0]), torch.Size([2**40]))]


def _unstored(entry) -> None:
    entry.chunks = [ChunkStorageMetadata(torch.Size([0]), torch.Size([6])),
                    ChunkStorageMetadata(torch.Size([6]), torch.Size([7]))]


CLAIMS = {
    "a 2**40-element tensor": (_huge, "tensor 'model.lin1.bias' claims 1,099,511,627,776 float32 elements "
                                      "(4,398,046,511,104 bytes) in its chunk at (0,), which '__0_0.distcp' stores in"),
    "a chunk no file holds": (_unstored, "no file holds the chunk at (6,) of tensor 'model.lin1.bias'"),
}


@pytest.mark.parametrize("claim", CLAIMS, ids=list(CLAIMS))
@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_metadata_claiming_more_than_the_data_files_hold_is_named_so(tmp_path, command, claim):
    change, said = CLAIMS[claim]
    folder = crafted_copy(tmp_path, change)
    line = refused(tmp_path, *read_command(command, folder, tmp_path / "out"))
    assert f"{folder / '.metadata'} does not match the checkpoint's data files ({said}" in line, line
    assert "is not this checkpoint's DCP metadata: copy the folder again" in line, line
    assert "unreadable" not in line and "allocate" not in line, line
    assert not (tmp_path / "out").exists()


def test_a_tensor_too_large_for_memory_is_named_as_such(monkeypatch):
    """A sound checkpoint whose tensor this machine cannot hold: the line says so, not that a file is damaged."""
    src = DcpSource(MODEL_OPTIM)

    def empty(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(torch, "empty", empty)
    with pytest.raises(CheckpointError) as e:
        src.load("lin1.bias")
    line = str(e.value)
    assert line.startswith("cannot hold model.lin1.bias in memory: .metadata gives it shape (13,) of torch.float32")
    assert "free memory" in line and "copy the folder" not in line and "\n" not in line, line

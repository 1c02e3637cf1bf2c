"""Bytes of a torch.save zip that no CRC covers: each local header's version, method, time and date, the data
descriptor after a record's bytes (CRC and sizes) and the end record's comment length. torch reads past each of
them, so a change there is damage only the directory can tell: `zbench inspect` and `zbench convert` name the file
in one line and write nothing."""

from __future__ import annotations

import shutil
import zipfile

import pytest

from checkpoints.zip_crc import ZipCorrupt, stored_records
from helpers import FIXTURES, one_line_error, read_command, zbench

RANK_FILE = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def _first_record_fields(path) -> dict[str, int]:
    """Offsets in `path` of one byte of each field the CRCs leave out."""
    with zipfile.ZipFile(path) as zf:
        info = zf.infolist()[0]
    at = info.header_offset
    data_end = at + 30 + int.from_bytes(path.read_bytes()[at + 26 : at + 28], "little") + int.from_bytes(
        path.read_bytes()[at + 28 : at + 30], "little") + info.compress_size
    assert info.flag_bits & 0x8  # torch puts CRC and sizes in a descriptor after the bytes
    return {"version": at + 4, "method": at + 8, "date": at + 12, "descriptor crc": data_end + 4,
            "descriptor size": data_end + 8, "end comment length": path.stat().st_size - 1}


@pytest.fixture
def ckpt(tmp_path):
    root = tmp_path / "ck"
    shutil.copytree(FIXTURES / "deepspeed" / "2_2_fp32", root,
                    ignore=shutil.ignore_patterns("expected*", "continued*"))
    return root


@pytest.mark.parametrize("field", ["version", "method", "date", "descriptor crc", "descriptor size",
                                   "end comment length"])
def test_a_changed_byte_outside_the_crcs_is_damage(ckpt, field):
    path = next(ckpt.glob(f"*/{RANK_FILE}"))
    stored_records(path)  # as saved: sound
    data = bytearray(path.read_bytes())
    data[_first_record_fields(path)[field]] ^= 0x41
    path.write_bytes(bytes(data))
    with pytest.raises(ZipCorrupt):
        stored_records(path)


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_readers_name_the_file_and_write_nothing(ckpt, tmp_path, command):
    path = next(ckpt.glob(f"*/{RANK_FILE}"))
    data = bytearray(path.read_bytes())
    data[_first_record_fields(path)["method"]] ^= 0x41
    path.write_bytes(bytes(data))
    line = one_line_error(zbench(*map(str, read_command(command, ckpt, tmp_path / "out"))))
    assert RANK_FILE in line and "local header disagrees" in line
    assert not (tmp_path / "out").exists()

"""The CRC check of torch.save zip files (checkpoints/zip_crc.py): the record a flipped byte lands in is named,
a crafted central directory is reported rather than followed, and the answer agrees with zipfile's own check."""

from __future__ import annotations

import struct
import zipfile

import pytest
import torch

from checkpoints import zip_crc
from checkpoints.deepspeed_pickle import check_zip_file, check_zip_files


def _saved(tmp_path, name="ckpt.pt"):
    path = tmp_path / name
    torch.save({"w": torch.arange(40_000, dtype=torch.float32), "b": torch.ones(7)}, path)
    return path


def _record_span(path, suffix):
    """(start, size) of the bytes of the record whose name ends with `suffix`."""
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(suffix))
    head = path.read_bytes()[info.header_offset : info.header_offset + 30]
    return info.header_offset + 30 + struct.unpack("<H", head[26:28])[0] + struct.unpack("<H", head[28:30])[0], \
        info.compress_size


def test_a_sound_file_passes_and_a_flipped_byte_names_its_record(tmp_path, monkeypatch):
    monkeypatch.setattr(zip_crc, "PIECE", 4096)  # the record spans many pieces
    path = _saved(tmp_path)
    assert zip_crc.first_bad_record(path) is None and check_zip_file(path) is None
    start, size = _record_span(path, "/data/0")
    data = bytearray(path.read_bytes())
    data[start + size - 3] ^= 0x10
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is not None  # zipfile agrees that it is damaged
    assert zip_crc.first_bad_record(path).endswith("/data/0")
    assert check_zip_file(path) == f"{path} is corrupt: record {zip_crc.first_bad_record(path)} fails its CRC check"


@pytest.mark.parametrize("field", ["header_offset", "compress_size"])
def test_a_central_directory_pointing_outside_the_file_is_reported(tmp_path, field):
    path = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    central = data.rfind(b"PK\x01\x02")  # the last record's central directory entry
    # compressed size at +20, local header offset at +42 (4 bytes each)
    at = central + (42 if field == "header_offset" else 20)
    data[at : at + 4] = struct.pack("<I", len(data) + 1000 if field == "header_offset" else 0x7FFFFFF0)
    path.write_bytes(bytes(data))
    problem = check_zip_file(path)
    assert problem is not None and problem.startswith(f"{path} is truncated or corrupt"), problem


def test_many_files_report_in_order(tmp_path):
    good, bad = _saved(tmp_path, "a.pt"), _saved(tmp_path, "b.pt")
    start, _ = _record_span(bad, "/data/1")
    data = bytearray(bad.read_bytes())
    data[start] ^= 0xFF
    bad.write_bytes(bytes(data))
    assert check_zip_files([good, bad, good]) == [f"{bad} is corrupt: record {zip_crc.first_bad_record(bad)} "
                                                  "fails its CRC check"]
    assert check_zip_files([good, tmp_path / "missing.pt"]) == [f"missing file {tmp_path / 'missing.pt'}"]

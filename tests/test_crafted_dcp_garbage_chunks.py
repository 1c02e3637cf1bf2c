"""A DCP chunk file overwritten with random bytes of the same size is damage, not "raw chunks without a
checksum": DCP writes a chunk either as a torch.save record (a zip, CRC-checked) or as exactly its elements'
bytes, so a chunk that is neither is reported by `zbench inspect` (non-zero exit) and refused by `convert`."""

from __future__ import annotations

import os
import shutil

from checkpoint_helpers import DCP
from checkpoints.dcp_chunk_check import _chunk_ok
from checkpoints.dcp_source import DcpSource
from helpers import cli, one_line_error, snapshot

PLAIN = next(p for p in DCP if p.name == "plain")


def _garbled(tmp_path):
    src = tmp_path / "dcp"
    shutil.copytree(PLAIN, src)
    chunk = src / "__0_0.distcp"
    size = chunk.stat().st_size
    chunk.write_bytes(bytes(b ^ 0x5A for b in os.urandom(size)).replace(b"PK", b"QK"))  # never a zip's start
    return src, chunk


def test_inspect_reports_a_garbled_chunk_file(tmp_path):
    src, chunk = _garbled(tmp_path)
    assert DcpSource(src).verify() == [
        f"{chunk} is corrupt: the chunk at byte 0 fails its check (a torch.save record's CRC, or a raw chunk's size)"
    ]
    line = one_line_error(cli("inspect", src))
    assert "__0_0.distcp is corrupt" in line


def test_convert_refuses_a_garbled_chunk_file_and_writes_nothing(tmp_path):
    src, _ = _garbled(tmp_path)
    before = snapshot(tmp_path)
    line = one_line_error(cli("convert", src, "--to", "fp32", "--out", tmp_path / "out"), alone=True)
    assert "__0_0.distcp is corrupt" in line
    assert snapshot(tmp_path) == before


def test_raw_chunks_of_their_exact_size_still_pass(tmp_path):
    raw = tmp_path / "raw.bin"
    raw.write_bytes(bytes(range(16)) * 4)  # 64 raw bytes: 16 float32 elements, as DCP writes raw chunks
    assert _chunk_ok(raw, 0, 64, 64)
    assert not _chunk_ok(raw, 0, 64, 32)
    assert _chunk_ok(raw, 0, 64, None)  # a non-tensor entry: no size to compare
    assert DcpSource(PLAIN).verify() == []

"""The CRC check of a torch.save zip file, at the speed of reading it.

torch.save writes every record uncompressed (ZIP_STORED), so a record's CRC-32 is that of its bytes as they
lie in the file. `zipfile.ZipFile.testzip` checks them through 1 MiB reads of a Python decompression stream;
here a stored record is read in 8 MiB pieces into one reused buffer and hashed with zlib (which releases the
GIL: several files check in parallel threads). A compressed record, which torch never writes, goes through
zipfile's own check. Offsets and sizes come from the central directory and are bounds-checked against the
file, so a crafted directory is reported, never followed outside the file or into an endless read.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from pathlib import Path

from . import direct_io

PIECE = 8 << 20
_LOCAL_HEADER = 30  # fixed part of a zip local file header; the name and extra field follow


class ZipCorrupt(ValueError):
    """The file is not a well-formed zip (the message says where)."""


def first_bad_record(path: Path) -> str | None:
    """The name of the first record whose bytes fail their CRC, or None; ZipCorrupt if the zip is malformed."""
    size = os.path.getsize(path)
    buf = bytearray(PIECE)
    view = memoryview(buf)
    with zipfile.ZipFile(path) as zf, open(path, "rb", buffering=0) as raw:
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                with zf.open(info) as member:  # zipfile checks the CRC when the stream ends
                    while member.read(1 << 20):
                        pass
                continue
            header = os.pread(raw.fileno(), _LOCAL_HEADER, info.header_offset)
            if len(header) != _LOCAL_HEADER or header[:4] != b"PK\x03\x04":
                raise ZipCorrupt(f"record {info.filename} has no local header at byte {info.header_offset}")
            start = info.header_offset + _LOCAL_HEADER + int.from_bytes(header[26:28], "little") + int.from_bytes(
                header[28:30], "little")
            if start + info.compress_size > size:
                raise ZipCorrupt(f"record {info.filename} runs past the end of the file")
            crc, pos, end = 0, start, start + info.compress_size
            while pos < end:
                want = min(PIECE, end - pos)
                if direct_io.read_at(raw.fileno(), view, pos, want) != want:
                    raise ZipCorrupt(f"record {info.filename} is cut short")
                crc = zlib.crc32(view[:want], crc)
                pos += want
            if crc != info.CRC:
                return info.filename
    return None

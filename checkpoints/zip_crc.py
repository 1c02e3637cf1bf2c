"""The records of a torch.save zip file (where each one's bytes lie, and their CRC-32), and the CRC check.

torch.save writes every record uncompressed (ZIP_STORED), so a record's CRC-32 is that of its bytes as they
lie in the file. `zipfile.ZipFile.testzip` checks them through 1 MiB reads of a Python decompression stream;
here a stored record is read in 8 MiB pieces into one reused buffer and hashed with zlib (which releases the
GIL: several files check in parallel threads). A compressed record, which torch never writes, goes through
zipfile's own check. Offsets and sizes come from the central directory and are bounds-checked against the
file, so a crafted directory is reported, never followed outside the file or into an endless read. The bytes
no CRC covers must agree with the directory too: each local header's version, flags, method, time, date, CRC and
sizes (those after the bytes, in a data descriptor, where torch puts them), and the end record's comment length.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from . import direct_io

PIECE = 8 << 20
_LOCAL_HEADER = 30  # fixed part of a zip local file header; the name and extra field follow
_END = b"PK\x05\x06"  # the end-of-central-directory record: 22 bytes and a comment of up to 64 KiB, last in the file
_END_BYTES = 22


class ZipCorrupt(ValueError):
    """The file is not a well-formed zip (the message says where)."""


@dataclass(frozen=True)
class Record:
    """One stored record: its name, where its bytes start in the file, how many, and their CRC-32."""

    name: str
    start: int
    size: int
    crc: int


def _folder_problem(infos: list[zipfile.ZipInfo]) -> str | None:
    """torch.save puts every record in one top folder (`<archive>/data.pkl`, `<archive>/data/0`, ...), and torch
    refuses a file where one lies elsewhere: the first record outside the first one's folder, or None."""
    folder = infos[0].filename.partition("/")[0] + "/" if infos else ""
    stray = next((i.filename for i in infos if not i.filename.startswith(folder) or folder == "/"), None)
    return None if stray is None else f"record {stray!r} lies outside the archive's folder {folder!r}"


def _extent_problem(raw: int, size: int, infos: list[zipfile.ZipInfo]) -> str | None:
    """A torch.save file is its zip archive and nothing else: the first record at byte 0, the end record (and its
    comment) last. torch and zipfile read past bytes after it, which no CRC covers and nothing reads, so they were
    put there after the file was written (as were bytes before it, which torch cannot read past)."""
    first = min((i.header_offset for i in infos), default=0)
    if first:
        return f"{first} bytes precede its first zip record: the file was damaged or altered"
    tail = os.pread(raw, min(size, _END_BYTES + 0xFFFF), max(0, size - _END_BYTES - 0xFFFF))
    at = tail.rfind(_END)  # where zipfile finds the end record, as torch's reader does
    end = at + _END_BYTES + int.from_bytes(tail[at + 20 : at + 22], "little") if at >= 0 else len(tail)
    if end < len(tail):
        return f"{len(tail) - end} bytes follow its zip archive's end: the file was damaged or altered"
    if end > len(tail):
        return "its zip end record gives a comment longer than the file: the file was damaged or altered"
    return None


def _dos_time(info: zipfile.ZipInfo) -> bytes:
    """The time and date fields a header holds for `info` (as zipfile decodes them into `date_time`)."""
    y, mo, d, h, mi, sec = info.date_time
    return ((h << 11) | (mi << 5) | (sec // 2)).to_bytes(2, "little") + (((y - 1980) << 9) | (mo << 5) | d).to_bytes(
        2, "little")


def _header_problem(raw: int, info: zipfile.ZipInfo, header: bytes, end: int) -> str | None:
    """Where record `info`'s local header, or its data descriptor (at byte `end`, where its bytes end), disagrees
    with the central directory: bytes no CRC covers, so changed after the save."""
    fields = (info.extract_version.to_bytes(2, "little") + info.flag_bits.to_bytes(2, "little")
              + info.compress_type.to_bytes(2, "little") + _dos_time(info))
    if header[4:14] != fields:
        return f"record {info.filename}'s local header disagrees with the zip directory"
    sums = info.CRC.to_bytes(4, "little")
    small = info.compress_size.to_bytes(8, "little")[:4] + info.file_size.to_bytes(8, "little")[:4]
    if not info.flag_bits & 0x8:  # CRC and sizes in the local header (0xFFFFFFFF: in its zip64 extra field)
        if header[14:18] != sums or header[18:26] not in (small, b"\xff" * 8):
            return f"record {info.filename}'s local header disagrees with the zip directory"
        return None
    large = info.compress_size.to_bytes(8, "little") + info.file_size.to_bytes(8, "little")
    after = os.pread(raw, 24, end)
    forms = (b"PK\x07\x08" + sums + small, sums + small, b"PK\x07\x08" + sums + large, sums + large)
    if not any(after.startswith(form) for form in forms):
        return f"record {info.filename}'s data descriptor disagrees with the zip directory"
    return None


def _local_name(raw: int, info: zipfile.ZipInfo, header: bytes) -> str:
    """The record name its local header gives, decoded as zipfile decodes the directory's."""
    length = int.from_bytes(header[26:28], "little")
    name = os.pread(raw, length, info.header_offset + _LOCAL_HEADER)
    return name.decode("utf-8" if info.flag_bits & 0x800 else "cp437", errors="replace")


def stored_records(path: Path) -> tuple[list[Record], list[zipfile.ZipInfo]]:
    """(stored records in directory order, compressed records) of the zip `path`; ZipCorrupt if malformed.

    Names are not covered by the CRCs: a record whose directory name differs from its local header's, or that
    lies outside the archive's one folder, is reported here (torch would refuse to load the file)."""
    size = os.path.getsize(path)
    stored: list[Record] = []
    with zipfile.ZipFile(path) as zf, open(path, "rb", buffering=0) as raw:
        infos = zf.infolist()
        problem = _folder_problem(infos) or _extent_problem(raw.fileno(), size, infos)
        if problem:
            raise ZipCorrupt(problem)
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:
                continue
            header = os.pread(raw.fileno(), _LOCAL_HEADER, info.header_offset)
            if len(header) != _LOCAL_HEADER or header[:4] != b"PK\x03\x04":
                raise ZipCorrupt(f"record {info.filename} has no local header at byte {info.header_offset}")
            local = _local_name(raw.fileno(), info, header)
            if local != info.orig_filename:
                raise ZipCorrupt(f"record {info.orig_filename!r} is named {local!r} in its local header")
            start = info.header_offset + _LOCAL_HEADER + int.from_bytes(header[26:28], "little") + int.from_bytes(
                header[28:30], "little")
            if start + info.compress_size > size:
                raise ZipCorrupt(f"record {info.filename} runs past the end of the file")
            problem = _header_problem(raw.fileno(), info, header, start + info.compress_size)
            if problem:
                raise ZipCorrupt(problem)
            stored.append(Record(info.filename, start, info.compress_size, info.CRC))
    return stored, [i for i in infos if i.compress_type != zipfile.ZIP_STORED]


def crc_of_range(fd: int, start: int, end: int, crc: int, view: memoryview) -> int:
    """`crc` carried on over the file's bytes [start, end), read through `view` in pieces of its length."""
    pos = start
    while pos < end:
        want = min(len(view), end - pos)
        if direct_io.read_at(fd, view, pos, want) != want:
            raise ZipCorrupt(f"the file is cut short at byte {pos}")
        crc = zlib.crc32(view[:want], crc)
        pos += want
    return crc


def first_bad_record(path: Path) -> str | None:
    """The name of the first record whose bytes fail their CRC, or None; ZipCorrupt if the zip is malformed."""
    stored, compressed = stored_records(path)
    with zipfile.ZipFile(path) as zf:
        for info in compressed:
            with zf.open(info) as member:  # zipfile checks the CRC when the stream ends
                while member.read(1 << 20):
                    pass
    view = memoryview(bytearray(PIECE))
    with open(path, "rb", buffering=0) as raw:
        for rec in stored:
            try:
                crc = crc_of_range(raw.fileno(), rec.start, rec.start + rec.size, 0, view)
            except ZipCorrupt:
                raise ZipCorrupt(f"record {rec.name} is cut short") from None
            if crc != rec.crc:
                return rec.name
    return None

"""Tensors of torch.save files read where they lie, each record's CRC-32 taken as its bytes go by.

The structure (dicts, lists, tensor shapes) comes from torch's weights-only unpickler with map_location="meta":
no tensor byte is read, and torch (>= 2.10) notes on each storage where its record's bytes start. A tensor is
then read with positioned reads straight into the caller's memory, bounds-checked against the zip directory.
Each record's CRC-32 is carried along as its bytes are read front to back, so a converter that reads the fp32
masters once has checked them in the same pass; `problems()` finishes every record read from (the bytes never
asked for, such as a partition's padding) and the small structure records, and compares. Records never read
(the Adam moments, when only weights are wanted) are not checked here: `check_zip_file` checks a whole file.

Where torch gives no offsets (older torch), the offsets do not match the zip directory, the file's byte order is
foreign, or the file predates the zip format, tensors are copied out of a memory mapping (legacy files and files
of the other byte order, which torch swaps as it loads them: out of memory), and `problems()` checks the whole of
each zip file opened.
"""

from __future__ import annotations

import functools
import io
import os
import re
import sys
import threading
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from . import direct_io
from .deepspeed_pickle import check_zip_file, load_pickle, walk
from .page_drop import drop_file_pages
from .source import CheckpointError
from .zip_crc import PIECE, ZipCorrupt, crc_of_range, stored_records

_OPEN_FILES = 64  # file descriptors kept open at once (a universal checkpoint has a file per parameter)
# An expanded (stride-0) view is saved as its small storage but written out, and read, at its full size: a few
# bytes on disk could ask for gigabytes. Past both bounds such a view is refused (docs/checkpoints.md).
EXPAND_LIMIT = 16
EXPAND_FLOOR = 64 << 20  # bytes: smaller views are read whatever their ratio (a broadcast mask, position ids)
_STORAGE = re.compile(r"/data/[^/]+$")  # torch.save names a storage's record `<archive>/data/<key>`


@functools.cache
def meta_offsets_supported() -> bool:
    """Whether this torch notes record offsets on storages loaded with map_location="meta"."""
    buf = io.BytesIO()
    torch.save(torch.zeros(1), buf)
    buf.seek(0)
    return hasattr(torch.load(buf, map_location="meta", weights_only=True).untyped_storage(), "_checkpoint_offset")


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable in place."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


def _span(t: torch.Tensor) -> int:
    """Elements of storage that tensor `t` reaches from its storage offset."""
    return 0 if t.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


class _RecordCrc:
    __slots__ = ("done", "crc")

    def __init__(self) -> None:
        self.done, self.crc = 0, 0


class _PositionedFile:
    """One zip-format file whose tensors are read by pread at the offsets torch noted; CRCs kept per record."""

    def __init__(self, path: Path, structure: Any, by_start: dict[int, Any], structure_records: list[Any]) -> None:
        self.path, self.structure = path, structure
        self._by_start, self._structure_records = by_start, structure_records
        self._fd: int | None = None
        self._crcs: dict[int, _RecordCrc] = {}
        self._lock = threading.Lock()
        self._scratch: memoryview | None = None

    @property
    def fd(self) -> int:
        """The file, opened on first use (the reader closes the least recently used past _OPEN_FILES)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # a larger kernel read-ahead
        return self._fd

    def read(self, t: torch.Tensor, first: int, dst: torch.Tensor) -> None:
        """Storage elements [first, first + dst.numel()) of `t`'s storage into the contiguous CPU tensor `dst`."""
        if dst.numel() == 0:
            return
        start = t.untyped_storage()._checkpoint_offset
        rec = self._by_start[start]  # every offset was matched to a record when the file was opened
        size = t.element_size()
        lo, n = first * size, dst.numel() * size
        if first < 0 or lo + n > rec.size:
            raise CheckpointError(f"{self.path}: a tensor runs past its record {rec.name}; the file is corrupt")
        view = _bytes_of(dst)
        with self._lock:  # one read at a time per file: the reader may close its descriptor between reads
            state = self._crcs.setdefault(start, _RecordCrc())
            try:
                if direct_io.read_at(self.fd, view, start + lo, n) != n:
                    raise ZipCorrupt("cut short")
                if lo > state.done:  # a gap: the bytes between count too, read once more
                    state.crc = crc_of_range(self.fd, start + state.done, start + lo, state.crc, self._piece())
                    state.done = lo
            except ZipCorrupt:
                raise CheckpointError(f"{self.path} is truncated (record {rec.name}); copy the file again") from None
            except OSError as e:
                raise CheckpointError(f"cannot read {self.path}: {e.strerror or e}; check the disk and the file")
            if lo <= state.done < lo + n:
                state.crc = zlib.crc32(view[state.done - lo:], state.crc)
                state.done = lo + n

    def _piece(self) -> memoryview:
        if self._scratch is None:
            self._scratch = memoryview(bytearray(PIECE))
        return self._scratch

    def problems(self) -> list[str]:
        """Finish the CRC of every record read from and of the structure records; the ones that fail."""
        with self._lock:
            todo = [(r, self._crcs.get(r.start) or _RecordCrc()) for r in self._structure_records]
            todo += [(self._by_start[s], c) for s, c in self._crcs.items()]
            for rec, state in todo:
                try:
                    crc = crc_of_range(self.fd, rec.start + state.done, rec.start + rec.size, state.crc, self._piece())
                except (ZipCorrupt, OSError):
                    return [f"{self.path} is truncated: record {rec.name} is cut short"]
                if crc != rec.crc:
                    return [f"{self.path} is corrupt: record {rec.name} fails its CRC check"]
        return []

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:  # a source dropped without a check still gives its descriptor back
        if self._fd is not None:
            os.close(self._fd)


class _MappedFile:
    """A file torch loads itself (memory-mapped when zip): tensors are copied out; the whole file is checked.
    A file of the other byte order is read into memory instead: torch swaps its bytes as it loads them, and pages
    of a mapping swapped in place must not be dropped (they would read back unswapped)."""

    def __init__(self, path: Path, foreign_order: bool = False) -> None:
        self.path = path
        self._zip = zipfile.is_zipfile(path)
        self._mapped = self._zip and not foreign_order
        self.structure = load_pickle(path, mmap=self._mapped)

    def read(self, t: torch.Tensor, first: int, dst: torch.Tensor) -> None:
        # copied as bytes: a record another writer left unaligned for its dtype (a complex128 storage at an odd
        # offset) crashes torch's typed copy kernels, which assume aligned elements
        storage, size = t.untyped_storage(), t.element_size()
        lo, hi = first * size, (first + dst.numel()) * size
        if first < 0 or hi > storage.nbytes():
            raise CheckpointError(f"{self.path}: a tensor runs past its storage; the file is corrupt")
        src = torch.empty(0, dtype=torch.uint8).set_(storage)[lo:hi]
        dst.view(-1).view(torch.uint8).copy_(src)
        if self._mapped:
            drop_file_pages(src)  # keep RSS at the caller's tensor, not the file

    def problems(self) -> list[str]:
        problem = check_zip_file(self.path) if self._zip else None
        return [problem] if problem else []

    def close(self) -> None:
        pass


def _open(path: Path) -> _PositionedFile | _MappedFile:
    if not zipfile.is_zipfile(path):
        return _MappedFile(path)
    try:  # before unpickling: a damaged zip directory is named here rather than through torch's reaction to it
        stored, _ = stored_records(path)
        order = next((r for r in stored if r.name.endswith("/byteorder")), None)
        # before unpickling too: torch swaps a foreign file's storages as it loads them, meta ones included (a crash)
        foreign = order is not None and _read(path, order) != sys.byteorder.encode()
    except (ZipCorrupt, zipfile.BadZipFile) as e:
        raise CheckpointError(f"{path} is truncated or corrupt ({e}); copy the file again from where it was saved")
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}; check that the file is readable") from None
    if foreign or not meta_offsets_supported():
        return _MappedFile(path, foreign)
    structure = load_pickle(path, map_location="meta")
    by_start = {r.start: r for r in stored}
    tensors = walk(path, structure)
    offsets = {getattr(t.untyped_storage(), "_checkpoint_offset", None) for t in tensors}
    if not offsets <= by_start.keys():
        return _MappedFile(path)  # a writer other than torch's: let torch read it
    for t in tensors:  # sizes come from the pickle: bound each storage by its record before anything is sized by it
        rec = by_start[t.untyped_storage()._checkpoint_offset]
        if t.untyped_storage().nbytes() > rec.size:
            raise CheckpointError(
                f"{path}: a tensor claims {t.untyped_storage().nbytes()} bytes but its record {rec.name} holds "
                f"{rec.size}; the file is corrupt or was not written by torch.save"
            )
    return _PositionedFile(path, structure, by_start, [r for r in stored if not _STORAGE.search(r.name)])


def _read(path: Path, rec: Any) -> bytes:
    with open(path, "rb") as f:
        f.seek(rec.start)
        return f.read(min(rec.size, 64))


class TorchFileReader:
    """torch.save files of one checkpoint: their structures, and tensor data read on demand and CRC-checked."""

    def __init__(self) -> None:
        self._files: dict[Path, _PositionedFile | _MappedFile] = {}
        self._recent: OrderedDict[Path, None] = OrderedDict()
        self._lock = threading.Lock()

    def _file(self, path: Path) -> _PositionedFile | _MappedFile:
        path = Path(path)
        with self._lock:
            if path not in self._files:
                self._files[path] = _open(path)
            self._recent[path] = None
            self._recent.move_to_end(path)
            while len(self._recent) > _OPEN_FILES:  # its CRC state stays; the file reopens when read again
                self._files[self._recent.popitem(last=False)[0]].close()
            return self._files[path]

    def get(self, path: Path) -> Any:
        """The unpickled content of `path`: plain data, with tensors that are placeholders for `read`/`tensor`."""
        return self._file(path).structure

    def read(self, path: Path, t: torch.Tensor, start: int, dst: torch.Tensor) -> None:
        """Elements [start, start + dst.numel()) of the contiguous tensor `t` of `path`, flattened, into `dst`."""
        assert dst.is_contiguous() and 0 <= start and start + dst.numel() <= t.numel(), (start, dst.numel())
        if not t.is_contiguous():
            raise CheckpointError(f"{path}: a flat tensor is stored with strides {t.stride()}; the file is corrupt")
        into = dst if dst.dtype == t.dtype else torch.empty(dst.numel(), dtype=t.dtype)
        self._file(path).read(t, t.storage_offset() + start, into)
        if into is not dst:
            dst.copy_(into)  # e.g. a bf16 frozen fragment into fp32

    def tensor(self, path: Path, t: torch.Tensor) -> torch.Tensor:
        """The whole tensor `t` of `path` as a new CPU tensor of its own."""
        span = _span(t)
        stored = t.untyped_storage().nbytes() // t.element_size()  # bounded by its record when the file was opened
        if min(t.stride(), default=0) < 0 or t.storage_offset() + span > stored:
            raise CheckpointError(f"{path}: a tensor of shape {tuple(t.shape)} (strides {t.stride()}) reaches past its "
                                  "storage; the file is corrupt or was not written by torch.save")
        if t.numel() > max(EXPAND_LIMIT * span, EXPAND_FLOOR // t.element_size()):
            raise CheckpointError(
                f"{path}: a tensor of shape {tuple(t.shape)} is an expanded view of {span} stored elements (strides "
                f"{t.stride()}), past what zbench expands ({EXPAND_FLOOR >> 20} MiB or {EXPAND_LIMIT}x its storage); "
                "save the checkpoint with that tensor .clone()d, or make it a non-persistent buffer"
            )
        flat = torch.empty(span, dtype=t.dtype)
        self._file(path).read(t, t.storage_offset(), flat)
        out = flat.as_strided(tuple(t.shape), tuple(t.stride()))
        return out if out.is_contiguous() else out.contiguous()

    def file_problems(self, path: Path) -> list[str]:
        """CRC failures in what was read of `path` (and its structure records): at most one line."""
        return self._file(path).problems()

    def problems(self) -> list[str]:
        """CRC failures in what was read (and the structure records), one line per file, in opening order."""
        problems = []
        for f in list(self._files.values()):
            problems += f.problems()
            f.close()
        return problems

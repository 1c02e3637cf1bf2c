"""Whether the bytes of a DCP folder's chunks are intact, as far as their format can tell.

DCP's FileSystemWriter stores a tensor chunk either as a `torch.save` record (a zip, starting with `PK`, whose
CRC-32s are checked here) or as the tensor's raw bytes, which carry no checksum: a raw chunk is exactly its
elements times their size. A chunk that is neither (not a zip, and not that many bytes) is damaged, so random
bytes in place of a torch.save'd chunk are reported as such rather than passed as "raw". A torch.save'd chunk
must also hold the dtype `.metadata` gives its tensor, in a storage of at least the chunk's elements: DCP's
reader casts what it loads into the tensor `.metadata` describes, so a dtype changed in either file would
otherwise be read as other values (float32 bytes as bool) without a word.
"""

from __future__ import annotations

import io
import math
import zipfile
from pathlib import Path
from typing import Any

import torch

from .torch_storage_ids import persistent_ids, storage_dtype, storage_problem


def raw_sizes(tensors: dict[str, Any]) -> dict[tuple[str, tuple[int, ...]], int]:
    """(key, chunk offsets) -> the bytes of that chunk's elements, for DCP's TensorStorageMetadata `tensors`."""
    return {
        (key, tuple(chunk.offsets)): math.prod(chunk.sizes) * meta.properties.dtype.itemsize
        for key, meta in tensors.items()
        for chunk in meta.chunks
    }


def held(tensors: dict[str, Any]) -> dict[tuple[str, tuple[int, ...]], tuple[int, torch.dtype]]:
    """(key, chunk offsets) -> (elements, dtype) of that chunk, for DCP's TensorStorageMetadata `tensors`."""
    return {
        (key, tuple(chunk.offsets)): (math.prod(chunk.sizes), meta.properties.dtype)
        for key, meta in tensors.items()
        for chunk in meta.chunks
    }


def chunk_problems(paths: dict[str, Path], entries: list[tuple[Any, Any]],
                   raw: dict[tuple[str, tuple[int, ...]], int], every_chunk: bool = False,
                   holds: dict[tuple[str, tuple[int, ...]], tuple[int, torch.dtype]] | None = None) -> list[str]:
    """One line per damaged file among the storage `entries` ((MetadataIndex, _StorageInfo) pairs): missing,
    shorter than its chunks, or holding a chunk that fails its check; `paths` maps relative paths to checked
    ones, `raw` is raw_sizes() of the folder's tensors. `every_chunk`: `entries` are all the folder's, so a
    .distcp file must also be exactly its chunks (extent_problems). `holds`: held() of the folder's tensors, what
    each torch.save'd chunk must hold."""
    bad: dict[str, str] = {}
    for index, info in entries:
        path = paths[info.relative_path]
        if str(path) in bad:
            continue
        if not path.is_file():
            bad[str(path)] = f"missing file {path}"
        elif path.stat().st_size < info.offset + info.length:
            bad[str(path)] = f"{path} is truncated ({path.stat().st_size} bytes, needs {info.offset + info.length})"
        elif not getattr(info, "transform_descriptors", None) and not _chunk_ok(
            path, info.offset, info.length, raw.get((index.fqn, tuple(index.offset or ()))),
            (holds or {}).get((index.fqn, tuple(index.offset or ()))),
        ):
            bad[str(path)] = (f"{path} is corrupt: the chunk at byte {info.offset} fails its check (a torch.save "
                              "record's CRC, or a raw chunk's size)")
    for path, problem in (extent_problems(paths, entries) if every_chunk else {}).items():
        bad.setdefault(path, problem)  # a truncated file is named as that
    return list(bad.values())


def extent_problems(paths: dict[str, Path], entries: list[tuple[Any, Any]]) -> dict[str, str]:
    """DCP's FileSystemWriter writes a .distcp file as its chunks back to back, each where .metadata says: bytes
    that no chunk covers (a gap, or anything after the last) are read by nothing and covered by no check, so
    whoever put them there altered the file. path -> the problem, for each such file."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for _, info in entries:
        spans.setdefault(info.relative_path, []).append((info.offset, info.offset + info.length))
    bad = {}
    for rel, ranges in spans.items():
        path = paths[rel]
        if not rel.endswith(".distcp") or not path.is_file():
            continue
        pos = 0
        for lo, hi in sorted(ranges):
            if lo > pos:
                bad[str(path)] = f"{path} holds {lo - pos} bytes at byte {pos} that no chunk covers: it was " \
                                 "damaged or altered"
                break
            pos = max(pos, hi)
        else:
            size = path.stat().st_size
            if size > pos:
                bad[str(path)] = f"{path} holds {size - pos} bytes after its last chunk: it was damaged or altered"
    return bad


def _chunk_ok(path: Path, offset: int, length: int, raw_bytes: int | None,
              holds: tuple[int, torch.dtype] | None = None) -> bool:
    """A torch.save'd chunk (a zip) passes its CRCs and stores `holds` (elements, dtype) where given; a raw one is
    exactly `raw_bytes` long (None: a non-tensor entry, whose bytes have no size to check)."""
    with open(path, "rb") as f:
        f.seek(offset)
        blob = f.read(length)
    if not blob.startswith(b"PK"):
        return raw_bytes is None or length == raw_bytes
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as zf:
            return zf.testzip() is None and storage_problem(zf) is None and (holds is None or _holds(zf, *holds))
    except (zipfile.BadZipFile, EOFError, ValueError):
        return False


def _holds(zf: zipfile.ZipFile, numel: int, dtype: torch.dtype) -> bool:
    """Whether the torch.save zip `zf` stores its tensor as `dtype`, in a storage of at least `numel` elements."""
    pickled = next((n for n in zf.namelist() if n.endswith("/data.pkl")), None)
    ids = persistent_ids(zf.read(pickled)) if pickled else []
    return {storage_dtype(pid) for pid in ids} == {dtype} and max(pid[4] for pid in ids) >= numel

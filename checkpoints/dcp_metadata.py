"""Read a DCP folder's `.metadata` safely: a pickle, unpickled with only DCP's own metadata classes allowed.

`.metadata` is written by `dcp.save` with pickle. A crafted one could name any importable callable, so the
unpickler allows only DCP's metadata dataclasses and enum, torch.Size, dtypes and layouts, paths and a few
builtin containers; then every field we use (entries, sizes, dtypes, chunk lists, file names, offsets,
lengths) has its type checked, so what reaches DCP's reader and the chunk-file checks is plain data.
Each tensor's chunks must tile it exactly (dcp_tiling.py): the reader fills a tensor made with torch.empty from
its chunks, so an element no chunk covers would be uninitialised memory in the output; overlaps are refused too.
"""

from __future__ import annotations

import math
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from .dcp_tiling import tiling_problem as _tiling_problem
from .paths import inside
from .source import CheckpointError

# DCP's metadata classes (plain dataclasses and an enum): the modules also hold readers, writers and
# thread pools, whose constructors a crafted pickle must not be able to call.
_DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
}
_SAFE = (
    {("pathlib", n) for n in ("Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")}
    | {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "slice"),
    }
    | {(module, name) for module, names in _DCP_CLASSES.items() for name in names}
)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        ok = (module, name) in _SAFE or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        if not ok:
            raise pickle.UnpicklingError(f"{module}.{name} is not a DCP metadata class")
        return super().find_class(module, name)


def read_metadata(folder: Path, follow_symlinks: bool = False) -> Any:
    """Unpickle `folder/.metadata` with only DCP's metadata classes allowed, and check its field types."""
    path = inside(folder, ".metadata", what="DCP metadata", follow_symlinks=follow_symlinks)
    try:
        with open(path, "rb") as f:
            md = _MetadataUnpickler(f).load()
            extra = os.fstat(f.fileno()).st_size - f.tell()  # dcp.save writes the pickle alone; its reader stops there
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}; check its permissions") from None
    except Exception as e:  # whatever the allowed constructors raise on crafted arguments
        raise CheckpointError(
            f"{path} is truncated, corrupt or not DCP metadata ({str(e)[:120]}); "
            "copy the folder again from where it was saved"
        ) from None
    if extra:
        raise CheckpointError(f"{path} holds {extra} bytes after its pickle: it was damaged or altered; copy the "
                              "folder again from where it was saved")
    problem = _field_problem(md)
    if problem:
        raise CheckpointError(
            f"{path} is not valid torch.distributed.checkpoint metadata ({problem}); "
            "the checkpoint is damaged or crafted: copy the folder again from where it was saved"
        )
    problem = _data_problem(md) or _shared_bytes_problem(md)
    if problem:
        raise CheckpointError(
            f"{path} does not match the checkpoint's data files ({problem}); it is damaged or is not this "
            "checkpoint's DCP metadata: copy the folder again from where it was saved"
        )
    return md


def _count(x: object) -> bool:
    return type(x) is int and x >= 0


def _counts(x: object, dims: int) -> bool:
    """A chunk's offsets or sizes: a tuple of `dims` counts."""
    return isinstance(x, tuple) and len(x) == dims and all(_count(d) for d in x)


def _data_problem(md: Any) -> str | None:
    """The first tensor chunk (of well-typed metadata) whose bytes no storage entry holds, or that claims more
    bytes than its entry's length, or None: a tensor is allocated from its claimed size before any byte is read."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    stored = {}
    for index, info in md.storage_data.items():
        if isinstance(index.offset, tuple):
            try:
                stored[(index.fqn, index.offset)] = info
            except TypeError:  # offsets holding unhashable values: no chunk's
                continue
    for key, entry in md.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            continue
        dtype = entry.properties.dtype
        for chunk in entry.chunks:
            need = math.prod(chunk.sizes) * dtype.itemsize
            if not need:
                continue
            info = stored.get((key, chunk.offsets))
            if info is None:
                return f"no file holds the chunk at {str(tuple(chunk.offsets))[:60]} of tensor {key[:60]!r}"
            if need > info.length and not info.transform_descriptors:  # torch.save'd or raw: never fewer bytes
                return (f"tensor {key[:60]!r} claims {math.prod(chunk.sizes):,} {str(dtype).removeprefix('torch.')} "
                        f"elements ({need:,} bytes) in its chunk at {str(tuple(chunk.offsets))[:60]}, which "
                        f"{info.relative_path[:60]!r} stores in {info.length:,} bytes")
    return None


def _shared_bytes_problem(md: Any) -> str | None:
    """Two storage entries whose byte ranges in one file overlap, or None. DCP's writer gives every item bytes of
    its own; entries sharing bytes would let a small crafted checkpoint claim (and a convert write) its files'
    size many times over, and have each read and checked again."""
    by_file: dict[str, list[tuple[int, int]]] = {}
    for info in md.storage_data.values():
        if info.length:
            by_file.setdefault(info.relative_path, []).append((info.offset, info.offset + info.length))
    for name, ranges in by_file.items():
        ranges.sort()
        for (a, end), (b, _) in zip(ranges, ranges[1:]):
            if b < end:
                return f"{name[:60]!r} gives bytes {b:,}-{end:,} to two entries (at {a:,} and {b:,})"
    return None


def _field_problem(md: Any) -> str | None:
    """The first field of DCP's metadata (as we use it) with the wrong type, or a tensor its chunks don't tile,
    or None."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    entries, storage = getattr(md, "state_dict_metadata", None), getattr(md, "storage_data", None)
    planner = getattr(md, "planner_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        return "no state_dict_metadata and storage_data mappings"
    for key, entry in entries.items():
        if not isinstance(key, str) or not isinstance(entry, (TensorStorageMetadata, BytesStorageMetadata)):
            return f"entry {str(key)[:60]!r} is not a tensor or bytes entry"
        if isinstance(entry, TensorStorageMetadata) and not (
            isinstance(getattr(getattr(entry, "properties", None), "dtype", None), torch.dtype)
            and isinstance(getattr(entry, "size", None), tuple)
            and all(_count(d) for d in entry.size)
            and isinstance(getattr(entry, "chunks", None), list)
        ):
            return f"tensor {key[:60]!r} has no dtype, size or chunk list"
        if isinstance(entry, TensorStorageMetadata):
            boxes = [(getattr(c, "offsets", None), getattr(c, "sizes", None)) for c in entry.chunks]
            if not all(
                isinstance(chunk, ChunkStorageMetadata) and _counts(o, len(entry.size)) and _counts(n, len(entry.size))
                for chunk, (o, n) in zip(entry.chunks, boxes)
            ):
                return f"a chunk of tensor {key[:60]!r} has no offsets and sizes of its {len(entry.size)} dimensions"
            gap = _tiling_problem(tuple(entry.size), boxes)
            if gap:
                return f"the chunks of tensor {key[:60]!r} {gap}"
    for index, info in storage.items():
        where = getattr(index, "fqn", None)
        if not isinstance(index, MetadataIndex) or not isinstance(where, str) or not isinstance(info, _StorageInfo):
            return "a storage entry is not a (MetadataIndex, _StorageInfo) pair"
        descriptors = getattr(info, "transform_descriptors", None)
        if not (
            isinstance(getattr(info, "relative_path", None), str)
            and _count(getattr(info, "offset", None))
            and _count(getattr(info, "length", None))
            and (descriptors is None or isinstance(descriptors, (list, tuple)))
        ):
            return f"the storage of {where[:60]!r} has no file name, offset or length"
    if planner is not None and not (
        isinstance(planner, dict)
        and all(isinstance(p, (list, tuple)) and all(isinstance(x, (str, int)) for x in p) for p in planner.values())
    ):
        return "planner_data is not a mapping of key paths"
    return None

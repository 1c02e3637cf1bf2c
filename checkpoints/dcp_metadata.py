"""Read a DCP folder's `.metadata` safely: a pickle, unpickled with only DCP's own metadata classes allowed.

`.metadata` is written by `dcp.save` with pickle. A crafted one could name any importable callable, so the
unpickler allows only DCP's metadata dataclasses and enum, torch.Size, dtypes and layouts, paths and a few
builtin containers; then every field we use (entries, sizes, dtypes, chunk lists, file names, offsets,
lengths) has its type checked, so what reaches DCP's reader and the chunk-file checks is plain data.
Each tensor's chunks must tile it exactly: the reader fills a tensor made with torch.empty from its chunks, so
an element no chunk covers would be uninitialised memory in the output, and overlapping chunks are refused too.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import torch

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
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}; check its permissions") from None
    except Exception as e:  # whatever the allowed constructors raise on crafted arguments
        raise CheckpointError(
            f"{path} is truncated, corrupt or not DCP metadata ({str(e)[:120]}); "
            "copy the folder again from where it was saved"
        ) from None
    problem = _field_problem(md)
    if problem:
        raise CheckpointError(
            f"{path} is not valid torch.distributed.checkpoint metadata ({problem}); "
            "the checkpoint is damaged or crafted: copy the folder again from where it was saved"
        )
    return md


def _count(x: object) -> bool:
    return type(x) is int and x >= 0


def _counts(x: object, dims: int) -> bool:
    """A chunk's offsets or sizes: a tuple of `dims` counts."""
    return isinstance(x, tuple) and len(x) == dims and all(_count(d) for d in x)


Box = tuple[tuple[int, ...], tuple[int, ...]]  # a chunk's (offsets, sizes)


def _tiling_problem(size: tuple[int, ...], boxes: list[Box]) -> str | None:
    """How the chunks fail to cover a tensor of `size` exactly once (as a phrase about them), or None."""
    if any(o + n > d for offsets, sizes in boxes for o, n, d in zip(offsets, sizes, size)):
        return "reach past its size"
    # a trailing dimension of 1 gives a 0-d tensor's chunk a dimension to sweep; chunks of no elements hold none
    boxes = [((*offsets, 0), (*sizes, 1)) for offsets, sizes in boxes if math.prod(sizes)]
    # sweep along the dimension the chunks split most: only chunks still open there can overlap the next one
    dim = max(range(len(size) + 1), key=lambda d: len({offsets[d] for offsets, _ in boxes}))
    still_open: list[Box] = []
    for offsets, sizes in sorted(boxes, key=lambda box: box[0][dim]):
        still_open = [(o, n) for o, n in still_open if o[dim] + n[dim] > offsets[dim]]
        if any(all(a < b + m and b < a + n for a, n, b, m in zip(offsets, sizes, other, other_sizes))
               for other, other_sizes in still_open):
            return "overlap"
        still_open.append((offsets, sizes))
    covered, elements = sum(math.prod(sizes) for _, sizes in boxes), math.prod(size)
    return f"cover {covered:,} of its {elements:,} elements" if covered != elements else None


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

"""Read a DCP folder's `.metadata` safely: a pickle, unpickled with only DCP's own metadata classes allowed.

`.metadata` is written by `dcp.save` with pickle. A crafted one could name any importable callable, so the
unpickler allows only DCP's metadata dataclasses and enum, torch.Size, dtypes and layouts, paths and a few
builtin containers; then every field we use (entries, sizes, dtypes, chunk lists, file names, offsets,
lengths) has its type checked, so what reaches DCP's reader and the chunk-file checks is plain data.
"""

from __future__ import annotations

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


def _field_problem(md: Any) -> str | None:
    """The first field of DCP's metadata (as we use it) with the wrong type, or None."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex, TensorStorageMetadata

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

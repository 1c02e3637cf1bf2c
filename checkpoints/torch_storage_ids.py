"""The storages a torch.save zip's pickle refers to, checked against the records that hold their bytes before
torch loads anything.

Each tensor's storage is named in the pickle by a persistent id, ('storage', <torch.XStorage>, key, location,
numel), and its bytes are the record `<archive>/data/<key>`. torch trusts the numel: with a crafted one it
maps or views more bytes than the record holds (the next records, or memory past the file), and a storage
dtype changed to one of wider elements makes torch's copy kernels read misaligned memory. So every id is read
from the pickle's opcodes (nothing is unpickled), and a storage larger than its record, or an id not in that
form, names the file as damaged or crafted.
"""

from __future__ import annotations

import pickletools
import zipfile
from typing import Any

import torch

_UNKNOWN = object()
_STRINGS = {"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING"}
_INTS = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"}
_PUTS = {"BINPUT", "LONG_BINPUT", "PUT"}
_GETS = {"BINGET", "LONG_BINGET", "GET"}


def _itemsize(storage_class: str) -> int | None:
    """Bytes per element of torch's storage class `storage_class` ('FloatStorage'), or None if unknown."""
    if storage_class == "UntypedStorage":
        return 1
    dtype = torch.storage._storage_type_to_dtype_map().get(storage_class)
    return None if dtype is None else dtype.itemsize


def storage_dtype(pid: Any) -> torch.dtype | None:
    """The dtype of the storage persistent id `pid` names (as storage_problem checked it), or None."""
    module, _, cls = str(pid[1][1]).partition(" ") if _well_formed(pid) else ("", "", "")
    return torch.storage._storage_type_to_dtype_map().get(cls) if module == "torch" else None


def _well_formed(pid: Any) -> bool:
    return (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], tuple)
            and len(pid[1]) == 2 and isinstance(pid[2], str) and isinstance(pid[4], int))


def persistent_ids(pickled: bytes) -> list[Any]:
    """The value each BINPERSID of `pickled` is given, where the opcodes before it build it from constants (a
    tuple of strings, ints and globals), else _UNKNOWN. Only the values within MARK frames are followed."""
    frames: list[list[Any]] = []
    memo: dict[Any, Any] = {}
    top: Any = _UNKNOWN
    found = []
    for op, arg, _ in pickletools.genops(pickled):
        name = op.name
        if name == "MARK":
            frames.append([])
            continue
        if name in _PUTS or name == "MEMOIZE":
            memo[arg if name != "MEMOIZE" else len(memo)] = top
            continue
        items = frames.pop() if pickletools.markobject in op.stack_before and frames else None
        popped = [frames[-1].pop() if frames and frames[-1] else _UNKNOWN
                  for _ in range(len([s for s in op.stack_before if s is not pickletools.markobject]))][::-1]
        if name in _STRINGS or name in _INTS:
            top = arg
        elif name == "GLOBAL":
            top = ("global", arg)
        elif name == "STACK_GLOBAL":
            top = ("global", f"{popped[0]} {popped[1]}") if all(isinstance(p, str) for p in popped) else _UNKNOWN
        elif name in _GETS:
            top = memo.get(arg, _UNKNOWN)
        elif name == "TUPLE" and items is not None:
            top = tuple(items)
        elif name == "BINPERSID":  # its id is the value just built (or fetched from the memo)
            found.append(top)
            top = _UNKNOWN
        else:
            top = _UNKNOWN
        if op.stack_after and frames:
            frames[-1].append(top)
    return found


def storage_problem(zf: zipfile.ZipFile) -> str | None:
    """Where a storage of the torch.save zip `zf` claims more bytes than its record holds, or is named in a form
    torch.save never writes; None when every one fits."""
    names = zf.namelist()
    pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        return None  # not torch's layout: torch's own reader refuses it
    archive = pickles[0][: -len("data.pkl")]
    sizes = {i.filename: i.file_size for i in zf.infolist()}
    try:
        ids = persistent_ids(zf.read(pickles[0]))
    except Exception as e:  # noqa: BLE001 - pickletools on crafted opcodes: torch.save's parse, whatever the error
        return f"its pickle does not parse ({type(e).__name__})"
    for pid in ids:
        if not _well_formed(pid):
            return "a tensor's storage is named in a form torch.save never writes"
        module, _, cls = str(pid[1][1]).partition(" ")
        size = _itemsize(cls) if module == "torch" else None
        record = f"{archive}data/{pid[2]}"
        if size is not None and (record not in sizes or not 0 <= pid[4] * size <= sizes[record]):
            held = f"its record holds {sizes[record]}" if record in sizes else "there is no such record"
            return f"storage {pid[2][:40]!r} claims {pid[4]} {cls[:-7] or 'byte'} elements but {held}"
    return None

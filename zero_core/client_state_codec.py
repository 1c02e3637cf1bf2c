"""The client_state of `save_checkpoint(client_state=...)` in the JSON manifest, with its types kept.

DeepSpeed pickles client_state, so scripts keep in it what pickle takes: their argparse `args`, RNG states
(tensors), numpy seeds and arrays, tuples, int keys, inf. The manifest is JSON and is never unpickled: a value
JSON gives back unchanged (text, numbers, bools, None, lists, dicts of text keys) is written as itself, any other
as a tagged object `{"__zbench__": kind, ...}`: a tuple, a dict with other keys (or with a key named like the tag,
so no user dict reads as a tag), inf/nan, a Namespace, a tensor (back on the CPU) or numpy value of an allow-listed
dtype (dtype name, shape, little-endian bytes in base64), a datetime, date, timedelta or pathlib path. Subclasses
of dict, list, str, int and float come back as those (as JSON gave them); a value held twice comes back as two.
Decoding builds only those types from checked plain data; an unknown tag or a malformed value is a one-line
CheckpointError naming the entry. Manifests written so carry ENCODING_KEY = ENCODING; older ones (plain JSON
client_state) are returned as they are. What cannot be kept is refused at save, by its path, before anything is
written. Bounds: MAX_CLIENT_STATE_DEPTH containers deep, MAX_CLIENT_STATE_BYTES of tensor and array data."""

from __future__ import annotations

import argparse
import base64
import binascii
import datetime as dt
import functools
import math
import pathlib
import sys
from pathlib import Path
from typing import Any

import torch

from checkpoints.manifest import MANIFEST
from checkpoints.manifest_checks import MAX_CLIENT_STATE_DEPTH, MAX_DIMS
from checkpoints.source import CheckpointError

ENCODING_KEY, ENCODING = "client_state_encoding", "zbench-typed-1"
TAG = "__zbench__"
MAX_CLIENT_STATE_BYTES = 64 << 20  # tensor and array data in one manifest: RNG states, seeds, small tables
MAX_INT_BITS = 8192  # Python's int-to-text limit (4300 digits) is far above this
TENSOR_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128, torch.int64,
    torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
NUMPY_DTYPES = (*(n for n in TENSOR_DTYPES if n != "bfloat16"), "uint16", "uint32", "uint64")
PATHS = {n: getattr(pathlib, n) for n in ("PurePosixPath", "PureWindowsPath", "PosixPath", "WindowsPath")}
ACCEPTED = ("dicts, lists, tuples, str, int, float, bool, None, argparse.Namespace, CPU-copyable torch tensors and "
            "numpy scalars/arrays of numbers or bools, datetime/date/timedelta, pathlib paths")
_FIELDS = {"tuple": {"items"}, "dict": {"items"}, "float": {"value"}, "namespace": {"attrs"},
           "tensor": {"dtype", "shape", "data"}, "ndarray": {"dtype", "shape", "data"}, "npscalar": {"dtype", "data"},
           "datetime": {"value"}, "date": {"value"}, "timedelta": {"value"}, "path": {"kind", "value"}}
_NOT_ONE_OF = "not one of "


class _Refused(Exception):
    """(path inside client_state, what is wrong there): turned into the one-line error by the public functions."""


def _text(where: Any) -> str:
    """An entry's path: (parent, key, style) tuples down from "client_state", made into text only for an error, so
    a save of a long list builds no string per element."""
    parts = []
    while isinstance(where, tuple):
        where, key, style = where
        shown = repr(key) if len(repr(key)) <= 40 else repr(key)[:37] + "..."
        parts.append({".": f".{key}", "i": f"[{key}]", "k": f" (key {key})"}.get(style, f"[{shown}]"))
    return where + "".join(reversed(parts))


class _Encoder:
    def __init__(self) -> None:
        self.data_bytes, self.open = 0, set()  # open: ids of the containers on the path being encoded

    def raw(self, where: Any, raw: bytes) -> str:
        self.data_bytes += len(raw)
        if self.data_bytes > MAX_CLIENT_STATE_BYTES:
            raise _Refused(where, f"takes the tensor and array data past {MAX_CLIENT_STATE_BYTES >> 20} MiB; "
                           "save large tensors with torch.save beside the checkpoint and keep their path instead")
        return base64.b64encode(raw).decode("ascii")

    def value(self, v: Any, where: Any, depth: int) -> Any:
        kind = type(v)
        if v is None or kind is str or kind is bool or kind is float and v - v == 0 or kind is int and \
                v.bit_length() <= MAX_INT_BITS:  # plain JSON first: a long list of them is saved fast
            return v
        if isinstance(v, str):  # subclasses (str enums, numpy's str_) as their text, as JSON wrote them
            return str.__str__(v)
        np = sys.modules.get("numpy")  # a numpy value can only exist once numpy is imported
        if np is not None and isinstance(v, (np.generic, np.ndarray)):
            return self.numpy(np, v, where)
        if type(v) is torch.Tensor:
            return self.tensor(v, where)
        if type(v) in (dt.datetime, dt.date, dt.timedelta):
            return self.time(v, where)
        if type(v) in PATHS.values():
            return {TAG: "path", "kind": type(v).__name__, "value": str(v)}
        if isinstance(v, int):
            if abs(v).bit_length() > MAX_INT_BITS:
                raise _Refused(where, f"is an integer of {abs(v).bit_length()} bits; store it as text")
            return int(v)
        if isinstance(v, float):
            return float(v) if math.isfinite(v) else {TAG: "float", "value": repr(float(v))}
        if isinstance(v, (dict, list, tuple)) or type(v) is argparse.Namespace:
            return self.container(v, where, depth)
        raise _Refused(where, f"is a {type(v).__module__}.{type(v).__qualname__}, which a checkpoint does not keep")

    def container(self, v: Any, where: Any, depth: int) -> Any:
        if depth >= MAX_CLIENT_STATE_DEPTH:
            raise _Refused(where, f"is nested more than {MAX_CLIENT_STATE_DEPTH} levels deep; pass flatter data")
        if id(v) in self.open:
            raise _Refused(where, "contains itself")
        self.open.add(id(v))
        if type(v) is argparse.Namespace:
            out: Any = {TAG: "namespace", "attrs": self.mapping(vars(v), where, depth + 1, attrs=True)}
        elif isinstance(v, dict):
            out = self.mapping(v, where, depth + 1)
        elif isinstance(v, list):
            out = [self.value(x, (where, i, "i"), depth + 1) for i, x in enumerate(v)]
        else:
            out = {TAG: "tuple", "items": [self.value(x, (where, i, "i"), depth + 1) for i, x in enumerate(v)]}
        self.open.discard(id(v))
        return out

    def mapping(self, v: dict, where: Any, depth: int, attrs: bool = False) -> Any:
        """A JSON object when every key is text and none is the tag; else [key, value] pairs (any key kept)."""
        style = "." if attrs else "[]"
        if all(isinstance(k, str) for k in v) and TAG not in v:
            return {str.__str__(k): self.value(x, (where, k, style), depth) for k, x in v.items()}
        items = [[self.value(k, where, depth), self.value(x, (where, k, style), depth)] for k, x in v.items()]
        return {TAG: "dict", "items": items}

    def tensor(self, t: torch.Tensor, where: Any) -> Any:
        name = str(t.dtype).removeprefix("torch.")
        if name not in TENSOR_DTYPES or t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
            raise _Refused(where, f"is a {t.layout} {t.dtype} tensor on {t.device.type}; tensors must be dense, "
                           f"of dtype {', '.join(TENSOR_DTYPES)}")
        flat = t.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        return {TAG: "tensor", "dtype": name, "shape": list(t.shape), "data": self.raw(where, flat.numpy().tobytes())}

    def numpy(self, np: Any, v: Any, where: Any) -> Any:
        if v.dtype.name not in NUMPY_DTYPES:
            raise _Refused(where, f"is a numpy value of dtype {v.dtype.name}; numpy values must be of dtype "
                           f"{', '.join(NUMPY_DTYPES)}")
        little = np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("<"))
        data = self.raw(where, little.tobytes())
        shape = {} if isinstance(v, np.generic) else {"shape": list(v.shape)}
        return {TAG: "ndarray" if shape else "npscalar", "dtype": v.dtype.name, **shape, "data": data}

    def time(self, v: Any, where: Any) -> Any:
        if isinstance(v, dt.timedelta):
            return {TAG: "timedelta", "value": [v.days, v.seconds, v.microseconds]}
        if isinstance(v, dt.datetime) and v.tzinfo is not None and type(v.tzinfo) is not dt.timezone:
            raise _Refused(where, f"is a datetime with a {type(v.tzinfo).__name__} timezone; convert it to UTC "
                           "(datetime.timezone.utc) or pass its isoformat() text")
        return {TAG: "datetime" if isinstance(v, dt.datetime) else "date", "value": v.isoformat()}


def encode(client_state: Any) -> dict[str, Any]:
    """The manifest's form of `client_state` (a copy: the caller may change it while the save writes); a one-line
    CheckpointError naming the first entry that cannot be kept, before anything is written."""
    if client_state is not None and not isinstance(client_state, dict):
        raise CheckpointError(f"client_state must be a dict (or None), got a {type(client_state).__name__}; "
                              "pass a dict of plain data, e.g. {'epoch': 3}")
    try:
        return _Encoder().container(client_state or {}, "client_state", 0)
    except _Refused as e:
        where, what = e.args
        raise CheckpointError(f"{_text(where)} {what}; pass only {ACCEPTED} in client_state (save other objects "
                              "yourself beside the checkpoint); nothing was saved") from None


def decode(manifest: dict[str, Any], folder: Any) -> dict[str, Any]:
    """The client_state of `manifest` (read from tag folder `folder`) as it was saved; an older manifest's as it
    is. A CheckpointError naming the entry for a tag or value that is not one encode writes."""
    saved, encoding, path = manifest["client_state"], manifest.get(ENCODING_KEY), Path(folder) / MANIFEST
    if encoding is None:
        return saved
    if encoding != ENCODING:
        raise CheckpointError(f"{path}: client_state is encoded as {str(encoding)[:40]!r}, which this zbench does "
                              f"not read ({ENCODING!r}); upgrade zbench or use an earlier checkpoint")
    try:
        decoded = _Decoder().value(saved, "client_state", 0)
        if type(decoded) is not dict:
            raise _Refused("client_state", f"is a {type(decoded).__name__}, not a dict")
        return decoded
    except _Refused as e:
        where, what = e.args
        raise CheckpointError(f"{path}: client_state entry {_text(where)} {what}; the manifest was edited or damaged "
                              "after the save: use an earlier checkpoint, or the zbench that saved it") from None


class _Decoder:
    data_bytes = 0  # of tensors and arrays decoded so far

    def value(self, v: Any, where: Any, depth: int) -> Any:
        if v is None or type(v) in (str, bool, int, float):
            return v
        if depth >= MAX_CLIENT_STATE_DEPTH:
            raise _Refused(where, f"is nested more than {MAX_CLIENT_STATE_DEPTH} levels deep")
        if type(v) is list:
            return [self.value(x, (where, i, "i"), depth + 1) for i, x in enumerate(v)]
        if type(v) is not dict:
            raise _Refused(where, f"is a {type(v).__name__}")
        if TAG not in v:
            return {k: self.value(x, (where, k, "[]"), depth + 1) for k, x in v.items()}
        kind = v[TAG]
        if not isinstance(kind, str) or kind not in _FIELDS:
            raise _Refused(where, f"has the unknown type tag {str(kind)[:40]!r}")
        if set(v) != _FIELDS[kind] | {TAG}:
            raise _Refused(where, f"is a {kind} with the fields {sorted(map(str, v))[:8]}, not {sorted(_FIELDS[kind])}")
        try:
            return getattr(self, f"kind_{kind}")(v, where, depth + 1)
        except (TypeError, ValueError, OverflowError, binascii.Error) as e:  # a field of the wrong form
            raise _Refused(where, f"is a malformed {kind} ({(str(e) or type(e).__name__).splitlines()[0][:80]})")

    def kind_tuple(self, v: dict, where: Any, depth: int) -> tuple:
        if type(v["items"]) is not list:
            raise _Refused(where, "holds items that are not a list")
        return tuple(self.value(x, (where, i, "i"), depth) for i, x in enumerate(v["items"]))

    def kind_dict(self, v: dict, where: Any, depth: int) -> dict:
        out = {}
        pairs = v["items"] if type(v["items"]) is list else [None]
        for i, pair in enumerate(pairs):
            if type(pair) is not list or len(pair) != 2:
                raise _Refused(where, "holds an item that is not a [key, value] pair")
            key = self.value(pair[0], (where, i, "k"), depth)
            hash(key)  # a TypeError for a list or a Namespace as key: malformed
            out[key] = self.value(pair[1], (where, key, "[]"), depth)
        return out

    def kind_float(self, v: dict, where: Any, depth: int) -> float:
        if v["value"] not in ("inf", "-inf", "nan"):
            raise _Refused(where, f"is a float tag of {str(v['value'])[:20]!r}, not 'inf', '-inf' or 'nan'")
        return float(v["value"])

    def kind_namespace(self, v: dict, where: Any, depth: int) -> argparse.Namespace:
        attrs = self.value(v["attrs"], where, depth - 1)  # its attributes are one level below it, not two
        if type(attrs) is not dict or not all(type(k) is str for k in attrs):
            raise _Refused(where, "is a namespace whose attributes are not a dict of names")
        made = argparse.Namespace()
        vars(made).update(attrs)  # not setattr: a name such as __class__ stays a plain attribute
        return made

    def _raw(self, v: dict, where: Any, itemsize: int, shape: Any) -> bytes:
        if type(shape) is not list or len(shape) > MAX_DIMS or not all(type(d) is int and d >= 0 for d in shape):
            raise _Refused(where, f"has the shape {str(shape)[:40]}, not a list of at most {MAX_DIMS} sizes")
        if not isinstance(v["data"], str) or len(v["data"]) > (MAX_CLIENT_STATE_BYTES - self.data_bytes) * 4 // 3 + 4:
            raise _Refused(where, f"holds data that is not base64 text within {MAX_CLIENT_STATE_BYTES >> 20} MiB")
        raw = base64.b64decode(v["data"], validate=True)
        self.data_bytes += len(raw)
        if len(raw) != math.prod(shape) * itemsize:
            raise _Refused(where, f"holds {len(raw)} bytes of data, not the {math.prod(shape) * itemsize} of its shape")
        return raw

    def kind_tensor(self, v: dict, where: Any, depth: int) -> torch.Tensor:
        dtype = TENSOR_DTYPES.get(v["dtype"]) if isinstance(v["dtype"], str) else None
        if dtype is None:
            raise _Refused(where, f"is a tensor of dtype {str(v['dtype'])[:20]!r}, {_NOT_ONE_OF}{list(TENSOR_DTYPES)}")
        raw = self._raw(v, where, dtype.itemsize, v["shape"])
        if not raw:
            return torch.empty(v["shape"], dtype=dtype)
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()
        return (flat != 0 if dtype is torch.bool else flat.view(dtype)).reshape(v["shape"])  # bools: 0/1 only

    def kind_ndarray(self, v: dict, where: Any, depth: int, scalar: bool = False) -> Any:
        import numpy as np

        if v["dtype"] not in NUMPY_DTYPES:
            raise _Refused(where, f"is a numpy value of dtype {str(v['dtype'])[:20]!r}, {_NOT_ONE_OF}{NUMPY_DTYPES}")
        dtype, shape = np.dtype(v["dtype"]), [] if scalar else v["shape"]
        raw = self._raw(v, where, dtype.itemsize, shape)  # little-endian; bools from their bytes, 0/1 only
        flat = np.frombuffer(raw, np.uint8) != 0 if dtype.kind == "b" else np.frombuffer(raw, dtype.newbyteorder("<"))
        return flat.astype(dtype)[0] if scalar else flat.astype(dtype).reshape(shape)  # native order, writable

    kind_npscalar = functools.partialmethod(kind_ndarray, scalar=True)

    def kind_datetime(self, v: dict, where: Any, depth: int, kind: Any = dt.datetime) -> Any:
        if not isinstance(v["value"], str) or len(v["value"]) > 64:
            raise _Refused(where, "holds a value that is not short text")
        return kind.fromisoformat(v["value"])

    kind_date = functools.partialmethod(kind_datetime, kind=dt.date)

    def kind_timedelta(self, v: dict, where: Any, depth: int) -> dt.timedelta:
        days, seconds, micro = v["value"] if type(v["value"]) is list and len(v["value"]) == 3 else (None,) * 3
        if not all(type(x) is int for x in (days, seconds, micro)):
            raise _Refused(where, "holds a value that is not [days, seconds, microseconds]")
        return dt.timedelta(days=days, seconds=seconds, microseconds=micro)

    def kind_path(self, v: dict, where: Any, depth: int) -> pathlib.PurePath:
        kind = PATHS.get(v["kind"]) if isinstance(v["kind"], str) else None
        if kind is None or not isinstance(v["value"], str):
            raise _Refused(where, f"is a path of kind {str(v['kind'])[:30]!r}, {_NOT_ONE_OF}{list(PATHS)}")
        if kind is not pathlib.Path().__class__ and kind in (pathlib.PosixPath, pathlib.WindowsPath):
            kind = pathlib.PurePosixPath if kind is pathlib.PosixPath else pathlib.PureWindowsPath  # another OS's
        return kind(v["value"])

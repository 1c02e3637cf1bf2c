"""Copies of the DeepSpeed fixtures with rewritten fields, for the tests of what the checkpoint readers refuse
(a helper module, not a test module): a scalar put in place in a rank file's pickle without unpickling it, a
model-states file saved again with changes, and the one-line refusal of opening the copy."""

from __future__ import annotations

import pickletools
import shutil
import struct
from pathlib import Path

import pytest
import torch

from checkpoints.deepspeed_pickle import load_pickle
from checkpoints.deepspeed_source import DeepSpeedSource
from checkpoints.source import CheckpointError
from helpers import FIXTURES, rewrite_torch_zip

_SCALARS = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "BINFLOAT", "BINUNICODE", "NEWTRUE", "NEWFALSE", "NONE"}


def opcode(value) -> bytes:
    """`value` as one pickle opcode (protocol 2)."""
    if isinstance(value, bool):
        return b"\x88" if value else b"\x89"
    if isinstance(value, int):
        raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        return b"\x8a" + bytes([len(raw)]) + raw
    if isinstance(value, float):
        return b"G" + struct.pack(">d", value)
    if isinstance(value, str):
        return b"X" + struct.pack("<I", len(value.encode())) + value.encode()
    assert value is None
    return b"N"


def rewrite_pickle(path: Path, change) -> None:
    """Rewrite the `data.pkl` record of the torch.save zip `path` as `change(bytes)` says; nothing is unpickled."""
    rewrite_torch_zip(path, lambda name, data: change(data) if name.endswith("/data.pkl") else data)


def patch(path: Path, key: str, value) -> None:
    """Put `value` in place of the first scalar that follows the first string `key` in `path`'s pickle (the
    value of dict entry `key`, or the first number inside it)."""

    def change(data: bytes) -> bytes:
        ops = list(pickletools.genops(data))
        at = next(k for k, (op, arg, _) in enumerate(ops) if arg == key and "UNICODE" in op.name)
        k = next(k for k in range(at + 1, len(ops)) if ops[k][0].name in _SCALARS)
        return data[: ops[k][2]] + opcode(value) + data[ops[k + 1][2]:]

    rewrite_pickle(path, change)


def resave(path: Path, **changes) -> None:
    """A model-states file (plain data and tensors) loaded, `changes` set on it, saved again."""
    state = load_pickle(path, mmap=False)
    state.update(changes)
    torch.save(state, path)


def crafted(tmp_path: Path, name: str, root: Path = FIXTURES / "deepspeed") -> Path:
    """A copy of fixture `root/name` under tmp_path; its tag folder."""
    shutil.copytree(root / name, tmp_path / name)
    return next(p for p in (tmp_path / name).iterdir() if p.is_dir())


def refuses(folder: Path, *words: str, opener=DeepSpeedSource) -> str:
    """Opening `folder` fails with one line holding `words`."""
    with pytest.raises(CheckpointError) as e:
        opener(folder)
    line = str(e.value)
    assert "\n" not in line and all(w in line for w in words), line
    return line

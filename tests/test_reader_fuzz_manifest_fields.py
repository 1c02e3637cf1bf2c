"""Every field of a real save's manifest (top level, layout, a params entry, the optimizer's) set to each value of
the wrong kind, with a matching manifest.sha256 as a crafted one would carry: opening and verifying the checkpoint
either works or is one CheckpointError line, never an exception of another kind from a check that used a field
before its own check ran (optimizer.state_keys, counted into the rank files' expected sizes, was)."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil

import pytest
from fault_workers import tiny_checkpoint

from checkpoints import manifest as mf
from checkpoints.source import CheckpointError
from checkpoints.zbench_source import ZbenchSource

WRONG = [None, "x", -1, 2**63, 1e308, [], {}, True, [[[]]]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt")
    return next(p for p in root.iterdir() if (p / mf.MANIFEST).is_file())


def _fields(manifest: dict) -> list[tuple]:
    return ([(k,) for k in manifest] + [("layout", k) for k in manifest["layout"]]
            + [("params", 0, k) for k in manifest["params"][0]] + [("optimizer", k) for k in manifest["optimizer"]]
            + [(table, k) for table in ("files", "fragments") for k in manifest[table]])


def _outcome(folder, manifest: dict) -> str:
    data = json.dumps(manifest).encode()
    (folder / mf.MANIFEST).write_bytes(data)
    (folder / mf.CHECKSUM).write_text(f"{hashlib.sha256(data).hexdigest()}  {mf.MANIFEST}\n")
    try:
        source = ZbenchSource(folder)
        source.params()
        source.verify()
    except CheckpointError as e:
        assert "\n" not in str(e), str(e)
        return "refused"
    return "read"


def test_each_field_of_the_wrong_kind_is_one_line_or_read(saved, tmp_path):
    folder = tmp_path / saved.name
    shutil.copytree(saved, folder)
    base = json.loads((saved / mf.MANIFEST).read_bytes())
    assert "state_keys" in base["optimizer"] and _outcome(folder, base) == "read"
    crashed = []
    for path in _fields(base):
        for value in WRONG:
            m = copy.deepcopy(base)
            node = m
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value
            try:
                _outcome(folder, m)
            except Exception as e:  # noqa: BLE001 - any other kind is what this test finds
                crashed.append(f"{'.'.join(map(str, path))}={value!r}: {type(e).__name__}: {e}")
    assert not crashed, crashed[:5]

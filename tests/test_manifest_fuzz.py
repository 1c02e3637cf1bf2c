"""A damaged or hostile manifest.json is a one-line CheckpointError, never a crash of another kind.

The fuzzed manifests carry a matching manifest.sha256, as a crafted one would: what stops them is the
structural check, not the checksum.
"""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from checkpoints import manifest as mf
from checkpoints.source import CheckpointError
from checkpoints.zbench_source import ZbenchSource

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
HUGE = st.sampled_from([10**24, 2**63, -1, 1e300, float("inf"), "1", [1], {"a": 1}, True])


def _valid() -> dict:
    """A structurally sound manifest: one trainable [2, 3] parameter over 2 ranks, one frozen buffer."""
    return {
        "format": mf.FORMAT,
        "version": mf.VERSION,
        "tag": "t",
        "step": 1,
        "micro_steps": 1,
        "world_size": 2,
        "stage": 2,
        "dtype": "float32",
        "layout": {"world_size": 2, "align": 4, "partition_numel": 4, "groups": [[0]]},
        "params": [
            {"name": "w", "shape": [2, 3], "dtype": "float32", "trainable": True, "tied_to": None, "slot": 0},
            {"name": "b", "shape": [3], "dtype": "float32", "trainable": False, "tied_to": None, "slot": None},
        ],
        "fragments": {"rank_00000.safetensors": [[0, 0, 0, 4]], "rank_00001.safetensors": [[0, 4, 0, 2]]},
        "files": {
            n: {"sha256": "0" * 64, "bytes": 100}
            for n in ("rank_00000.safetensors", "rank_00001.safetensors", "frozen.safetensors")
        },
        "optimizer": {"applied": 1.0, "skipped": 0.0},
        "loss_scaler": {"cur_scale": [1.0]},
        "rng": {},
        "client_state": {},
    }


def _write(folder, manifest) -> None:
    data = json.dumps(manifest).encode()
    (folder / mf.MANIFEST).write_bytes(data)
    (folder / mf.CHECKSUM).write_text(f"{hashlib.sha256(data).hexdigest()}  {mf.MANIFEST}\n")


def _open(folder) -> None:
    try:
        src = ZbenchSource(folder)
        src.params()
        src.verify()
    except CheckpointError as e:
        assert "\n" not in str(e) and len(str(e)) < 600


def test_the_base_manifest_is_sound(tmp_path):
    _write(tmp_path, _valid())
    assert [p.name for p in ZbenchSource(tmp_path).params()] == ["w", "b"]


def _paths(obj, prefix=()):
    """Every path to a value inside the manifest."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


PATHS = [p for p in _paths(_valid()) if p]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=json_values | HUGE)
@example(path=("version",), value=[{"k" * 30: [-4.9e110] * 5} for _ in range(6)])  # a long nested format value
def test_one_corrupted_value_anywhere(tmp_path, path, value):
    m = copy.deepcopy(_valid())
    node = m
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    _write(tmp_path, m)
    _open(tmp_path)


@pytest.mark.parametrize(
    "path,value,expected",
    [
        (("fragments", "rank_00001.safetensors", 0, 1), 3, "exactly once"),  # overlapping fragments
        (("fragments", "rank_00001.safetensors", 0, 3), 1, "cover 5 of 6"),
        (("fragments", "rank_00000.safetensors", 0, 2), 2, "outside its parameter or partition"),
        (("params", 1, "shape"), [10**24], "bad params entry"),
        (("params", 0, "dtype"), "complex128", "bad params entry"),
        (("layout", "world_size"), 3, "does not fit world size"),
        (("files", "frozen.safetensors", "bytes"), -1, "bad file entry"),
        (("files", "rank_00000.safetensors", "bytes"), 8, "too few for its partition"),
        (("loss_scaler", "cur_scale"), [[1.0] * 1000], "not a number"),
        (("loss_scaler", "cur_scale"), [0.0], "not a positive number"),  # every gradient infinite
        (("loss_scaler", "cur_scale"), -4.0, "not a positive number"),
        (("loss_scaler", "cur_iter"), [2.5], "whole number"),
        (("loss_scaler", "last_overflow_iter"), [-2], "whole number"),
        (("loss_scaler", "dynamic"), 7, "not 0 or 1"),
        (("scheduler",), {"last_batch_iteration": 10**30}, "last_batch_iteration"),  # overflows float lrs
        (("scheduler",), {"last_batch_iteration": -2}, "last_batch_iteration"),
        (("scheduler",), {"scheduler": {"last_batch_iteration": 1.5}}, "scheduler.scheduler.last_batch"),
        (("scheduler",), {"scheduler": {}, "stepped": -1}, "stepped"),
        (("tag",), "../x", "not a plain folder name"),
        (("tag",), ".hid", "not a plain folder name"),  # a reshard would write a folder readers refuse
        (("tag",), "a\\b", "not a plain folder name"),
        (("tag",), "\u0000", "not a plain folder name"),
        (("tag",), "latest", "pointer file"),
        (("params", 0, "name"), "__metadata__", "bad params entry"),  # safetensors' own header entry
    ],
)
def test_inconsistent_values_are_named(tmp_path, path, value, expected):
    m = _valid()
    m["scheduler"] = {}
    node = m
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    _write(tmp_path, m)
    with pytest.raises(CheckpointError, match="damaged") as e:
        ZbenchSource(tmp_path)
    assert expected in str(e.value)


def test_an_edit_without_the_checksum_is_detected(tmp_path):
    _write(tmp_path, _valid())
    edited = json.loads((tmp_path / mf.MANIFEST).read_text())
    edited["params"][0]["shape"] = [3, 2]  # same element count: only the checksum can tell
    (tmp_path / mf.MANIFEST).write_text(json.dumps(edited))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        ZbenchSource(tmp_path)
    (tmp_path / mf.CHECKSUM).unlink()
    with pytest.raises(CheckpointError, match="manifest.sha256 is missing"):
        ZbenchSource(tmp_path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
def test_garbage_manifest(tmp_path, raw):
    (tmp_path / mf.MANIFEST).write_bytes(raw)
    with pytest.raises(CheckpointError):
        ZbenchSource(tmp_path)


def test_deeply_nested_manifest_is_one_line(tmp_path):
    (tmp_path / mf.MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="unreadable"):
        ZbenchSource(tmp_path)


def test_file_names_cannot_escape_the_folder(tmp_path):
    m = _valid()
    m["files"]["../../etc/passwd"] = {"sha256": "0" * 64, "bytes": 1}
    _write(tmp_path, m)
    with pytest.raises(CheckpointError, match="does not match the rank files"):
        ZbenchSource(tmp_path)

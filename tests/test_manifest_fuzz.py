"""A damaged or hostile manifest.json is a one-line CheckpointError, never a crash of another kind."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoints import zbench_format as fmt
from checkpoints.source import CheckpointError
from checkpoints.zbench_source import ZbenchSource

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
KEYS = ["tag", "step", "micro_steps", "world_size", "stage", "params", "fragments", "files", "optimizer",
        "loss_scaler", "rng", "client_state", "layout", "version", "format"]


def _valid() -> dict:
    return {"format": fmt.FORMAT, "version": 1, "tag": "t", "step": 1, "micro_steps": 1, "world_size": 1, "stage": 1,
            "params": [{"name": "w", "shape": [2], "dtype": "float32", "trainable": True, "tied_to": None, "slot": 0}],
            "fragments": {"rank_00000.safetensors": [[0, 0, 0, 2]]},
            "files": {"rank_00000.safetensors": {"sha256": "0" * 64, "bytes": 1}},
            "optimizer": {}, "loss_scaler": {}, "rng": {}, "client_state": {}, "layout": {}}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(KEYS), value=json_values)
def test_one_corrupted_field(tmp_path, key, value):
    m = _valid()
    m[key] = value
    (tmp_path / fmt.MANIFEST).write_text(json.dumps(m))
    try:
        src = ZbenchSource(tmp_path)
        src.params()
        src.verify()
    except CheckpointError as e:
        assert "\n" not in str(e)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
def test_garbage_manifest(tmp_path, raw):
    (tmp_path / fmt.MANIFEST).write_bytes(raw)
    with pytest.raises(CheckpointError):
        ZbenchSource(tmp_path)


def test_file_names_cannot_escape_the_folder(tmp_path):
    m = _valid()
    m["files"] = {"../../etc/passwd": {"sha256": "0" * 64, "bytes": 1}}
    (tmp_path / fmt.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        ZbenchSource(tmp_path)

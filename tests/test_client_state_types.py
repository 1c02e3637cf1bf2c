"""save_checkpoint(client_state=...) keeps what scripts put there on DeepSpeed (which pickles it): an argparse
Namespace, RNG-state tensors, numpy scalars and arrays, tuples, int keys, inf/nan, ... come back from
load_checkpoint with their types, through the manifest's typed JSON (zero_core/client_state_codec.py); a dict that
looks like a tag stays a dict; a crafted manifest is one line; what cannot be kept is named by its path before
anything is written. The other way, a real DeepSpeed checkpoint holding such values, is
test_client_state_types_deepspeed.py."""

from __future__ import annotations

import argparse
import datetime as dt
import enum
import json
import pathlib
import shutil
import zoneinfo
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from test_checkpoint_safety import _rewrite
from torch import nn

import zero_core.deepspeed as deepspeed
from checkpoints import manifest as mf
from checkpoints.source import CheckpointError
from helpers import fixture_script

# its client() and _same(): the values DeepSpeed saved and the type-exact compare
made = fixture_script("make_client_state_types")
same = made._same


class Color(str, enum.Enum):
    RED = "red"


def _engine(stage: int = 0):
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


@pytest.fixture(scope="module")
def engine():
    made_engine = _engine()
    yield made_engine
    made_engine.close()


def _round_trip(engine, folder: Path, state: dict) -> dict:
    engine.save_checkpoint(folder, tag="t", client_state=state)
    _, back = engine.load_checkpoint(folder, tag="t")
    return {k: back[k] for k in state}  # zero_core.deepspeed's load puts DeepSpeed's own entries first


def every_kind() -> dict:
    big_endian = np.arange(3, dtype=">i4")
    return {
        "args": argparse.Namespace(lr=0.1, layers=[2, (3, 4)], out=None, seed_state=torch.tensor([1, 2])),
        "rng": torch.get_rng_state(),
        "tensors": [torch.tensor(2.5, dtype=torch.float64), torch.arange(6, dtype=torch.int16).reshape(2, 3).t(),
                    torch.tensor([1.5, -2.0], dtype=torch.bfloat16), torch.tensor([True, False]),
                    torch.empty(0, 3), torch.tensor([1 + 2j], dtype=torch.complex64),
                    torch.tensor([-1], dtype=torch.int8)],
        "numpy": [np.int64(7), np.float32(0.25), np.bool_(True), np.uint8(255), np.complex128(1 - 1j),
                  np.arange(6, dtype=np.float16).reshape(2, 3), np.asfortranarray(np.ones((2, 3))), np.array(5),
                  np.random.RandomState(0).get_state()[1][:4]],
        "pair": (1, "a", (2.5, None), ()),
        "floats": [float("inf"), float("-inf"), -0.0, 1e-310],
        "int_keys": {3: "three", -1: [1], 2.5: "x", None: 0, True: "t", (1, 2): "tuple key"},
        "big": 2**100, "text": "é\u2028", "flag": False, "none": None,
        "when": [dt.datetime(2024, 5, 6, 7, 8, 9, 10, tzinfo=dt.timezone(dt.timedelta(hours=2))),
                 dt.datetime(2024, 1, 1), dt.date(2020, 2, 29), dt.timedelta(days=-1, seconds=5, microseconds=7)],
        "paths": [pathlib.Path("/data/run 1"), pathlib.PurePosixPath("a/b"), pathlib.PureWindowsPath(r"C:\x\y")],
        "nested": {"a": {"b": [{"c": (np.int32(1), torch.zeros(1))}]}},
    }, big_endian


def test_each_type_comes_back_with_its_type_and_value(engine, tmp_path):
    state, big_endian = every_kind()
    back = _round_trip(engine, tmp_path / "ck", {**state, "big_endian": big_endian})
    wrong = [k for k in state if not same(state[k], back[k])]
    assert not wrong, {k: (state[k], back[k]) for k in wrong}
    assert back["big_endian"].tolist() == [0, 1, 2] and back["big_endian"].dtype == np.int32  # native order now
    assert back["numpy"][6].flags.c_contiguous and back["tensors"][1].is_contiguous()
    assert back["nested"]["a"]["b"][0]["c"][1].device.type == "cpu"
    torch.set_rng_state(back["rng"])  # a real RNG state again


def test_zero_core_engines_get_the_saved_state_alone_with_its_types(tmp_path):
    import zero_core

    torch.manual_seed(0)
    plain = zero_core.initialize(nn.Linear(2, 2), {"train_micro_batch_size_per_gpu": 1})
    state = {"args": argparse.Namespace(seed=np.int64(3)), "pair": (1, torch.ones(2))}
    try:
        plain.save_checkpoint(tmp_path / "ck", tag="t", client_state=state)
        _, back = plain.load_checkpoint(tmp_path / "ck", tag="t")
    finally:
        plain.close()
    assert same(state, back)  # no DeepSpeed entries beside it: zero_core.initialize's load returns the keys saved


def test_nan_and_subclasses_come_back_as_json_gave_them(engine, tmp_path):
    state = {"nan": float("nan"), "color": Color.RED, "ordered": OrderedDict(b=1, a=2), "np_text": np.str_("x")}
    back = _round_trip(engine, tmp_path / "ck", state)
    assert back["nan"] != back["nan"] and type(back["nan"]) is float
    assert type(back["color"]) is str and back["color"] == "red"
    assert type(back["ordered"]) is dict and list(back["ordered"]) == ["b", "a"]
    assert type(back["np_text"]) is str


def test_plain_json_state_is_written_as_itself(engine, tmp_path):
    state = {"epoch": 3, "losses": [0.5, 0.25], "sampler": {"pos": 17, "seed": None}, "ok": True}
    engine.save_checkpoint(tmp_path / "ck", tag="t", client_state=state)
    manifest = json.loads((tmp_path / "ck" / "t" / mf.MANIFEST).read_text())
    assert manifest["client_state"] == state  # other readers of the manifest see plain data where it is plain
    assert manifest["client_state_encoding"] == "zbench-typed-1"  # and know that tags may appear in it


def test_dicts_that_look_like_tags_stay_dicts(engine, tmp_path):
    lookalikes = {
        "tensor": {"__zbench__": "tensor", "dtype": "float32", "shape": [1], "data": "AAAAAA=="},
        "tuple": {"__zbench__": "tuple", "items": [1, 2]},
        "unknown": {"__zbench__": "pickle", "payload": "x"},
        "inside": [{"__zbench__": "dict", "items": [[1, 2]]}],
        "args": argparse.Namespace(__zbench__="namespace", attrs={}),
    }
    state = {**lookalikes, "__zbench__": "float"}  # client_state itself too
    assert same(state, _round_trip(engine, tmp_path / "ck", state))


def test_manifests_without_the_encoding_key_load_unchanged(engine, tmp_path):
    """An older manifest's client_state is plain JSON: returned as it is, tag-shaped dicts included."""
    engine.save_checkpoint(tmp_path / "ck", tag="t", client_state={})
    old = {"epoch": 2, "looks_tagged": {"__zbench__": "tuple", "items": [1]}, "inf": float("inf")}

    def as_older_zbench(m):
        m.pop("client_state_encoding", None)
        m["client_state"] = old

    _rewrite(tmp_path / "ck" / "t", as_older_zbench)
    _, back = engine.load_checkpoint(tmp_path / "ck", tag="t")
    assert {k: back[k] for k in old} == old


@pytest.fixture(scope="module")
def saved(engine, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("crafted") / "ck"
    engine.save_checkpoint(root, tag="t", client_state={"x": (1, 2)})
    return root


def _entry(value):
    def change(m):
        m["client_state"]["x"] = value
    return change


CRAFTED = {
    "unknown tag": (_entry({"__zbench__": "pickle", "data": "gASV"}), "client_state['x'] has the unknown type tag"),
    "tag not text": (_entry({"__zbench__": ["tuple"], "items": []}), "client_state['x'] has the unknown type tag"),
    "missing field": (_entry({"__zbench__": "tuple"}), "client_state['x'] is a tuple with the fields"),
    "extra field": (_entry({"__zbench__": "tuple", "items": [], "call": "os.system"}), "is a tuple with the fields"),
    "items not a list": (_entry({"__zbench__": "tuple", "items": "ab"}), "holds items that are not a list"),
    "bad base64": (_entry({"__zbench__": "tensor", "dtype": "uint8", "shape": [2], "data": "!!"}), "malformed tensor"),
    "bytes vs shape": (_entry({"__zbench__": "tensor", "dtype": "float32", "shape": [3], "data": "AAAAAA=="}),
                       "holds 4 bytes of data, not the 12 of its shape"),
    "tensor dtype": (_entry({"__zbench__": "tensor", "dtype": "object", "shape": [], "data": ""}),
                     "is a tensor of dtype 'object'"),
    "negative shape": (_entry({"__zbench__": "tensor", "dtype": "uint8", "shape": [-1], "data": ""}),
                       "has the shape [-1]"),
    "numpy object": (_entry({"__zbench__": "ndarray", "dtype": "O", "shape": [1], "data": "AAAAAAAAAAA="}),
                     "is a numpy value of dtype 'O'"),
    "float tag": (_entry({"__zbench__": "float", "value": "1e999999"}), "is a float tag of '1e999999'"),
    "namespace attrs": (_entry({"__zbench__": "namespace", "attrs": [1]}), "attributes are not a dict of names"),
    "pair": (_entry({"__zbench__": "dict", "items": [[1, 2, 3]]}), "not a [key, value] pair"),
    "unhashable key": (_entry({"__zbench__": "dict", "items": [[[1], 2]]}), "is a malformed dict"),
    "datetime": (_entry({"__zbench__": "datetime", "value": "yesterday"}), "is a malformed datetime"),
    "path kind": (_entry({"__zbench__": "path", "kind": "socket", "value": "/x"}), "is a path of kind 'socket'"),
    "deep": (_entry(json.loads("[" * 70 + "]" * 70)), "is nested more than 64 levels deep"),
    "top not a dict": (lambda m: m.update(client_state={"__zbench__": "tuple", "items": []}),
                       "client_state is a tuple, not a dict"),
    "encoding": (lambda m: m.update(client_state_encoding="zbench-typed-9"), "encoded as 'zbench-typed-9'"),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_crafted_client_state_is_one_line_before_any_change(engine, saved, tmp_path, case):
    change, words = CRAFTED[case]
    root = tmp_path / "ck"
    shutil.copytree(saved, root)
    _rewrite(root / "t", change)
    with torch.no_grad():
        engine.module.weight.add_(1.0)
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(root, tag="t")
    text = str(e.value)
    assert words in text and "\n" not in text and str(root / "t" / mf.MANIFEST) in text, text
    assert "earlier checkpoint" in text or "upgrade zbench" in text, text
    assert all(torch.equal(v, before[k]) for k, v in engine.module.state_dict().items())  # nothing loaded


class Opaque:
    pass


REFUSED = {
    "lambda": ({"opt": {"fn": lambda: 0}}, "client_state['opt']['fn'] is a builtins.function"),
    "module": ({"m": [np]}, "client_state['m'][0] is a builtins.module"),
    "object": ({"o": (1, Opaque())}, "client_state['o'][1] is a test_client_state_types.Opaque"),
    "in args": ({"args": argparse.Namespace(lr=1, cb=print)}, "client_state['args'].cb is a builtins."),
    "set": ({"s": {1, 2}}, "client_state['s'] is a builtins.set"),
    "parameter": ({"p": nn.Parameter(torch.ones(1))}, "client_state['p'] is a torch.nn.parameter.Parameter"),
    "sparse": ({"t": torch.eye(2).to_sparse()}, "client_state['t'] is a torch.sparse_coo"),
    "numpy objects": ({"a": np.array([object()])}, "client_state['a'] is a numpy value of dtype object"),
    "zone": ({"d": dt.datetime(2024, 1, 1, tzinfo=zoneinfo.ZoneInfo("UTC"))}, "datetime with a ZoneInfo timezone"),
    "huge int": ({"n": 2**9000}, "client_state['n'] is an integer of 9001 bits"),
    "too large": ({"big": [torch.zeros(40 << 20, dtype=torch.uint8), torch.zeros(30 << 20, dtype=torch.uint8)]},
                  "client_state['big'][1] takes the tensor and array data past 64 MiB"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_cannot_be_kept_is_named_by_path_before_anything_is_written(engine, tmp_path, case):
    state, words = REFUSED[case]
    with pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(tmp_path / "ck", client_state=state)
    text = str(e.value)
    assert words in text and "\n" not in text and "argparse.Namespace" in text and "nothing was saved" in text, text
    assert not (tmp_path / "ck").exists()


def test_a_structure_holding_itself_is_refused(engine, tmp_path):
    loop: list = [1]
    loop.append({"again": loop})
    with pytest.raises(CheckpointError, match=r"^client_state\['loop'\]\[1\]\['again'\] contains itself;"):
        engine.save_checkpoint(tmp_path / "ck", client_state={"loop": loop})
    assert not (tmp_path / "ck").exists()


def test_lightning_convert_reads_the_typed_state(engine, tmp_path):
    from zero_core.integrations.lightning_convert import convert_zero_checkpoint_to_fp32_state_dict

    engine.save_checkpoint(tmp_path / "ck", tag="t", client_state={"epoch": 1, "pair": (1, 2), "by_step": {5: "x"}})
    out = convert_zero_checkpoint_to_fp32_state_dict(tmp_path / "ck", tmp_path / "model.pt")
    assert same({"epoch": 1, "pair": (1, 2), "by_step": {5: "x"}}, {k: out[k] for k in ("epoch", "pair", "by_step")})

"""A real DeepSpeed checkpoint whose client_state holds an argparse Namespace, numpy scalars and arrays, tuples,
a bf16 tensor and int keys (fixtures/client_state_types, made by fixtures/make_client_state_types.py) loads in
zero_core with each value of its type, as DeepSpeed's own load gives it, and `zbench inspect` reads it; the names
allowed for those values build nothing else (checkpoints/pickle_plain_types.py)."""

from __future__ import annotations

import argparse
import shutil
import sys

import numpy as np
import pytest
import torch

from checkpoints.deepspeed_pickle import load_pickle
from checkpoints.source import CheckpointError
from helpers import FIXTURES, cli
from test_client_state_types import _engine, made, same


def test_deepspeed_client_state_of_namespace_numpy_and_tuples_loads(tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(FIXTURES / "client_state_types", root)
    loader = _engine(stage=2)
    try:
        _, back = loader.load_checkpoint(root)
    finally:
        loader.close()
    expected = made.client()
    wrong = [k for k in expected if not same(expected[k], back[k])]
    assert not wrong, {k: (expected[k], back.get(k)) for k in wrong}
    result = cli("inspect", root)
    assert result.exit_code == 0 and "deepspeed" in result.output, result.output


class _Reduced:
    """Pickles as `target(*args)` (then `state` set on it): how a crafted file asks the unpickler to build a value
    through one of the names it allows."""

    def __init__(self, target, args, state=None):
        self.target, self.args, self.state = target, args, state

    def __reduce__(self):
        return (self.target, self.args) if self.state is None else (self.target, self.args, self.state)


def _numpy_scalar():
    return sys.modules["numpy._core.multiarray"].scalar  # how np.int64(7) pickles: scalar(dtype, its bytes)


CRAFTED_PICKLES = {
    "namespace called": (lambda: _Reduced(argparse.Namespace, ("x",)), "holds a Namespace argparse did not pickle"),
    "namespace state": (lambda: _Reduced(argparse.Namespace, (), [1, 2]),
                        "holds a Namespace whose attributes are not a dict"),
    "object scalar": (lambda: _Reduced(_numpy_scalar(), (np.dtype("O"), [1])), "holds a numpy scalar of dtype O"),
    "scalar bytes": (lambda: _Reduced(_numpy_scalar(), (np.dtype("int64"), b"\x01")),
                     "holds a numpy scalar of dtype i8"),
}


@pytest.mark.parametrize("case", CRAFTED_PICKLES)
def test_deepspeed_plain_types_build_nothing_else(tmp_path, case):
    make, words = CRAFTED_PICKLES[case]
    root = tmp_path / "ds"
    shutil.copytree(FIXTURES / "client_state_types", root)
    path = root / "t" / "mp_rank_00_model_states.pt"
    state = load_pickle(path, mmap=False)  # DeepSpeed's own entries are plain data: saved again as they are
    state = {k: v for k, v in state.items() if k not in made.client()} | {"evil": make()}
    torch.save(state, path)
    loader = _engine(stage=2)
    try:
        with pytest.raises(CheckpointError) as e:
            loader.load_checkpoint(root)
    finally:
        loader.close()
    text = str(e.value)
    assert f"its entry 'evil' {words}" in text and "\n" not in text, text

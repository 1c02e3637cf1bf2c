"""Rank files whose unpickled structure contains itself (a list appended to itself) or shares sub-structures
(each level a list holding the level below twice: 2**80 paths in a few hundred bytes): every reader walks each
container once, refuses a cycle or a nesting deeper than MAX_DEPTH in one line, and never hangs."""

from __future__ import annotations

import contextlib
import pickle
import shutil
import signal
from pathlib import Path

import pytest
import torch

from checkpoints.deepspeed_pickle import MAX_DEPTH, DeepSpeedObject, walk
from checkpoints.deepspeed_source import DeepSpeedSource
from checkpoints.source import CheckpointError
from deepspeed_crafting import rewrite_pickle
from helpers import FIXTURES, one_line_error, snapshot, zbench

OPTIM = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
MODEL = "mp_rank_00_model_states.pt"


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail (TimeoutError) instead of hanging when the block runs past `seconds`."""

    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def cycle() -> list:
    loop: list = []
    loop.append(loop)
    return loop


def dag(levels: int) -> list:
    x: list = []
    for _ in range(levels):
        x = [x, x]
    return x


def crafted(tmp_path: Path, file: str, key: str, value) -> Path:
    """A copy of the ZeRO-2 fixture whose rank file `file` has entry `key` set to `value` (plain data, pickled
    after the file's own structure); the copy's root."""
    root = tmp_path / "ck"
    shutil.copytree(FIXTURES / "deepspeed" / "2_2_fp32", root)
    tail = pickle.dumps(key, protocol=2)[2:-1] + pickle.dumps(value, protocol=2)[2:-1] + b"s."
    rewrite_pickle(next(p for p in root.iterdir() if p.is_dir()) / file, lambda data: data[:-1] + tail)
    return root


def test_walk_refuses_cycles_and_deep_nesting_in_one_line():
    with deadline(10):
        for bad, words in [
            (cycle(), "a list that contains itself"),
            ({"a": {"b": cycle()}}, "its entry 'a' holds a list that contains itself"),
            ({"x": dag(80)}, f"its entry 'x' holds containers nested deeper than {MAX_DEPTH} levels"),
        ]:
            with pytest.raises(CheckpointError) as e:
                walk(Path("f.pt"), bad)
            assert "\n" not in str(e.value) and words in str(e.value) and "copy the file again" in str(e.value)
        obj = DeepSpeedObject()
        obj.__dict__["me"] = {"again": obj}
        with pytest.raises(CheckpointError, match="DeepSpeedObject that contains itself"):
            walk(Path("f.pt"), {"scaler": obj})


def test_shared_sub_structures_are_walked_once_and_accepted():
    t = torch.zeros(3)
    shared = dag(MAX_DEPTH - 2)
    shared[0].append(t)  # reached through 2**62 paths, found once
    with deadline(10):
        found = walk(Path("f.pt"), {"x": shared, "y": [t, t, (t,)]})
    assert len(found) == 1 and found[0] is t


@pytest.mark.parametrize("value", [cycle(), dag(80)], ids=["cycle", "dag"])
@pytest.mark.parametrize("file", [OPTIM, MODEL])
def test_cli_inspect_and_convert_refuse_in_one_line(tmp_path, value, file):
    root = crafted(tmp_path, file, "ds_config", {"x": value})
    before = snapshot(tmp_path)
    for cmd in (["inspect", root], ["convert", root, "--to", "fp32", "--out", tmp_path / "out"]):
        line = one_line_error(zbench(*map(str, cmd), timeout=120))
        assert file in line and "its entry 'ds_config' holds" in line, line
    assert snapshot(tmp_path) == before


def test_library_and_engine_load_refuse(tmp_path):
    import zero_core.deepspeed as deepspeed
    from test_deepspeed_resume import ds_fixtures

    root = crafted(tmp_path, OPTIM, "ds_config", {"x": cycle()})
    with deadline(60), pytest.raises(CheckpointError, match="contains itself"):
        DeepSpeedSource(next(p for p in root.iterdir() if p.is_dir())).params()
    torch.manual_seed(0)
    model = ds_fixtures.Tiny()
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    try:
        with deadline(60), pytest.raises(CheckpointError, match="contains itself"):
            engine.load_checkpoint(root)
    finally:
        engine.close()

"""What a DeepSpeed run passed as save_checkpoint(client_state=...) comes back from engine.load_checkpoint with its
values, tensors read from the file (as DeepSpeed's own load_checkpoint returns them), and damage to those bytes is
named; `zbench convert --to zbench --world-size` is bounded before any work."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from checkpoint_helpers import flip_element
from fault_workers import tiny_checkpoint
from checkpoints.deepspeed_pickle import load_pickle
from checkpoints.source import CheckpointError
from helpers import FIXTURES, refused, zbench, one_line_error

MODEL = "mp_rank_00_model_states.pt"
EMA = torch.tensor([0.5, 1.5, 2.5])


def with_client_state(tmp_path: Path, **client) -> Path:
    """A copy of the ZeRO-2 fixture whose model-states file also holds `client` (as save_checkpoint(client_state=)
    writes it: entries beside DeepSpeed's own); the copy's root."""
    root = tmp_path / "ck"
    shutil.copytree(FIXTURES / "deepspeed" / "2_2_fp32", root)
    path = root / "global_step2" / MODEL
    state = load_pickle(path, mmap=False)
    state.update(client)
    torch.save(state, path)
    return root


def _engine():
    import zero_core.deepspeed as deepspeed
    from test_deepspeed_resume import ds_fixtures

    torch.manual_seed(0)
    model = ds_fixtures.Tiny()
    model.norm.weight.requires_grad_(False)  # as the fixture's run had it
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def test_client_state_tensors_come_back_with_their_values(tmp_path):
    shared = [torch.arange(4)]
    root = with_client_state(tmp_path, epoch=2, ema=EMA.clone(), sampler={"pos": torch.tensor(17)},
                             pair=(shared, shared))
    engine = _engine()
    try:
        _, client = engine.load_checkpoint(root)
    finally:
        engine.close()
    assert client["epoch"] == 2 and client["ema"].device.type == "cpu"
    assert torch.equal(client["ema"], EMA) and int(client["sampler"]["pos"]) == 17
    assert client["ema"] + 1 is not None and torch.equal(client["pair"][0][0], torch.arange(4))
    assert client["pair"][0] is client["pair"][1]  # a part shared in the file is one object, as pickle gives it


def test_damaged_client_state_tensor_is_named(tmp_path):
    root = with_client_state(tmp_path, ema=EMA.clone())
    flip_element(root / "global_step2" / MODEL, EMA, 1)
    engine = _engine()
    try:
        with pytest.raises(CheckpointError) as e:
            engine.load_checkpoint(root)
    finally:
        engine.close()
    assert MODEL in str(e.value) and "CRC" in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.fixture(scope="module")
def zbench_ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt")


@pytest.mark.parametrize("world, words", [
    (1_000_000, "--world-size 1000000 is more than 65536 ranks (one file each); pass --world-size 65536 or fewer"),
    (2**16 + 1, "pass --world-size 65536 or fewer"),
])
def test_reshard_world_size_past_the_cap_is_refused_up_front(tmp_path, zbench_ckpt, world, words):
    line = one_line_error(zbench("convert", str(zbench_ckpt), "--to", "zbench", "--world-size", str(world),
                                 "--out", str(tmp_path / "out"), timeout=60))
    assert words in line, line
    assert list(tmp_path.iterdir()) == []


def test_reshard_world_size_past_the_elements_is_refused_before_writing(tmp_path, zbench_ckpt):
    from checkpoints.zbench_source import ZbenchSource

    elements = sum(math.prod(p["shape"])
                   for p in ZbenchSource(zbench_ckpt).manifest["params"] if p.get("slot") is not None)
    line = refused(tmp_path, "convert", zbench_ckpt, "--to", "zbench", "--world-size", elements + 1,
                   "--out", tmp_path / "out")
    assert f"trainable elements to shard ({elements}); pass --world-size {elements} or fewer" in line, line
    assert not (tmp_path / "out").exists()


def test_numpy_arrays_of_plain_dtypes_are_read_and_objects_refused(tmp_path):
    import numpy as np

    rng = np.random.get_state()
    root = with_client_state(tmp_path, rng_state={"np_rng_state": rng}, grid=np.arange(6.0).reshape(2, 3).T)
    engine = _engine()
    try:
        _, client = engine.load_checkpoint(root)
    finally:
        engine.close()
    got = client["rng_state"]["np_rng_state"]
    assert got[0] == "MT19937" and got[1].dtype == np.uint32 and np.array_equal(got[1], rng[1]) and got[2:] == rng[2:]
    assert np.array_equal(client["grid"], np.arange(6.0).reshape(2, 3).T)
    out = tmp_path / "out"
    assert zbench("convert", str(root), "--to", "fp32", "--out", str(out), timeout=120).returncode == 0
    shutil.rmtree(out)
    for bad in (np.array([1, "a"], dtype=object), np.zeros(2, dtype=[("a", "i4"), ("b", "f4")])):
        shutil.rmtree(root)
        root = with_client_state(tmp_path, rng_state=bad)
        line = one_line_error(zbench("convert", str(root), "--to", "fp32", "--out", str(out), timeout=120))
        assert "its entry 'rng_state' holds a numpy array of dtype" in line and "client_state" in line, line
        assert "really a checkpoint" not in line and not out.exists()

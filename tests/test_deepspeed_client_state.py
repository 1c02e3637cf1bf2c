"""What a DeepSpeed run passed as save_checkpoint(client_state=...) comes back from engine.load_checkpoint with its
values, tensors read from the file (as DeepSpeed's own load_checkpoint returns them), and damage to those bytes is
named; `zbench convert --to zbench --world-size` is bounded before any work. The whole client_state, DeepSpeed's own
entries included, and the lr and step readers after a load are those real DeepSpeed's gave (fixtures/client_state)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from checkpoint_helpers import flip_element
from fault_workers import tiny_checkpoint
from checkpoints.deepspeed_pickle import load_pickle
from checkpoints.source import CheckpointError
from helpers import FIXTURES, fixture_script, one_line_error, refused, zbench

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


# -- the client_state load_checkpoint returns, against what DeepSpeed 0.19.8's returned (make_client_state.py) --
made = fixture_script("make_client_state")
RECORDED = json.loads((FIXTURES / "client_state" / "expected.json").read_text(encoding="utf-8"))
# the readers DeepSpeed's engine and zero_core's agree on right after a load (DeepSpeed's scheduler get_last_lr()
# still says what it said before the load, until its next step)
READERS = ("get_lr", "last_batch_iteration", "global_steps", "global_samples", "skipped_steps")


def _made_engine(case: str):
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    model = made.Tied()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=made.groups(model),
                                      config=made.config(*made.CASES[case]))
    return engine


def _readers(engine) -> dict:
    got = made.readers(engine)
    return {k: got[k] for k in READERS}


def _recorded(case: str, load: str) -> tuple[list[str], dict, dict]:
    """(keys, described entries, readers after) DeepSpeed's load returned for `load` of `case`."""
    loads = RECORDED["cases"][case]["loads"]
    entries = {**loads["all"]["client_state"], **loads[load]["client_state"]}
    keys = loads[load]["keys"]
    return keys, {k: entries[k] for k in keys}, {k: loads[load]["after"][k] for k in READERS}


def _described(client: dict, case: str) -> dict:
    return {k: made.entry(k, v, made.config(*made.CASES[case])) for k, v in client.items()}


@pytest.mark.parametrize("case", list(made.CASES))
def test_a_zbench_checkpoint_comes_back_as_deepspeeds(tmp_path, case):
    """Saved and loaded by the drop-in: DeepSpeed's entries, types and values, but stage 0's optimizer state_dict
    (DeepSpeed's torch optimizer's, not rebuilt) and the version (zero_core's deepspeed's)."""
    from zero_core.deepspeed import __version__

    saver = _made_engine(case)
    for batch in made.batches():
        saver.backward(saver(batch))
        saver.step()
    assert _readers(saver) == {k: RECORDED["cases"][case]["saver"][k] for k in READERS}
    saver.save_checkpoint(tmp_path, tag="t", client_state=dict(made.CLIENT))
    saver.close()
    stage = made.CASES[case][0]
    for load, flags in made.LOADS.items():
        keys, entries, after = _recorded(case, load)
        if stage == 0:  # DeepSpeed's own optimizer's state_dict
            keys = [k for k in keys if k != "optimizer"]
            entries.pop("optimizer", None)
        entries["ds_version"] = __version__
        engine = _made_engine(case)
        try:
            path, client = engine.load_checkpoint(tmp_path, tag="t", **flags)
            assert path == str(tmp_path / "t" / "rank_00000.safetensors") and list(client) == keys, (load, list(client))
            assert _described(client, case) == entries, load
            assert _readers(engine) == after, load
        finally:
            engine.close()
    assert __version__.split("+")[0] == RECORDED["deepspeed"]


@pytest.mark.parametrize("case", made.SAVED_CASES)
def test_a_deepspeed_checkpoint_comes_back_as_deepspeeds(case):
    """DeepSpeed's own checkpoint: every entry as DeepSpeed's load returned it, its tensors read from the file."""
    root = FIXTURES / "client_state" / case
    for load, flags in made.LOADS.items():
        keys, entries, after = _recorded(case, load)
        engine = _made_engine(case)
        try:
            path, client = engine.load_checkpoint(root, **flags)
            assert list(client) == keys and _described(client, case) == entries, load
            assert _readers(engine) == after, load
        finally:
            engine.close()
    assert isinstance(client["param_shapes"][0]["emb.weight"], torch.Size)


def _saved_and_loaded_on_two_ranks(rank: int, world: int, root: str) -> list:
    """Each rank's client_state from loading the zbench checkpoint this run saves in `root`, then DeepSpeed's."""
    saver = _made_engine(made.TWO_RANKS)
    for batch in made.batches():
        saver.backward(saver(batch))
        saver.step()
    saver.save_checkpoint(root, tag="t", client_state=dict(made.CLIENT))
    saver.close()
    got = []
    for source in (root, FIXTURES / "client_state" / made.TWO_RANKS_DIR):
        engine = _made_engine(made.TWO_RANKS)
        _, client = engine.load_checkpoint(source, tag="t")
        got.append({"keys": list(client), "client_state": _described(client, made.TWO_RANKS)})
        engine.close()
    every = [None] * world
    torch.distributed.all_gather_object(every, got)
    return every


def test_at_zero_3_each_rank_gets_its_own_files_entries(tmp_path):
    """DeepSpeed's ZeRO-3 ranks each read their own model-states file: their own slice of a frozen parameter, and
    the ties only on rank 0 (rank 0 alone records them)."""
    from dist_harness import run_ranks
    from zero_core.deepspeed import __version__

    recorded = json.loads((FIXTURES / "client_state" / f"{made.TWO_RANKS_DIR}.json").read_text(encoding="utf-8"))
    every = run_ranks(_saved_and_loaded_on_two_ranks, 2, str(tmp_path / "ckpt"))
    for rank, (ours, deepspeed) in enumerate(every):
        expected = {"keys": recorded[rank]["keys"], "client_state": recorded[rank]["client_state"]}
        assert deepspeed == expected, rank
        expected["client_state"] = {**expected["client_state"], "ds_version": __version__}
        assert ours == expected, rank
    assert every[1][0]["client_state"]["shared_params"] == {"dict": {}}

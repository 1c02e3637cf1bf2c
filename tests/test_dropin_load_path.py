"""`engine.load_checkpoint(dir)` returns, as DeepSpeed 0.19.8's does, a str path to the file holding this rank's
model states, spelled from `dir` as given (relative stays relative): `dir/<tag>/rank_0000r.safetensors` for a
zbench checkpoint (the rank file this rank read its weights from, its own where the run saved as many ranks),
DeepSpeed's own `dir/<tag>/mp_rank_00_model_states.pt` (ZeRO-3: `zero_pp_rank_<r>_mp_rank_00_model_states.pt`)
for a DeepSpeed checkpoint, and (None, None) for a folder that does not exist. DeepSpeed's answers:
tests/fixtures/deepspeed_load_path.json, made by tests/fixtures/make_dropin_load_path.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from test_deepspeed_resume import ZERO
from test_deepspeed_resume import _engine as deepspeed_fixture_engine

from dist_harness import run_ranks

DEEPSPEED = json.loads((Path(__file__).parent / "fixtures" / "deepspeed_load_path.json").read_text())


def _engine(stage: int):
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    return engine


def _theirs(world: int, case: str, rank: int, load_dir: str, tag: str) -> str:
    """DeepSpeed's path for that load, its tag "t1" replaced by `tag`."""
    recorded = DEEPSPEED[f"world{world}"][case][rank]
    assert recorded["type"] == "str"
    return recorded["path"].replace("{load_dir}", load_dir, 1).replace("/t1/", f"/{tag}/")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_zbench_checkpoint_names_its_rank_file_beside_deepspeeds(tmp_path, monkeypatch, stage):
    monkeypatch.chdir(tmp_path)
    engine = _engine(stage)
    engine.save_checkpoint("ck", tag="t1")
    path, _ = engine.load_checkpoint("ck")
    assert path == os.path.join("ck", "t1", "rank_00000.safetensors")
    # the folder DeepSpeed's path is in, its file zbench's
    assert os.path.dirname(path) == os.path.dirname(_theirs(1, f"stage{stage}", 0, "ck", "t1"))
    assert engine.load_checkpoint(Path("ck"), tag="t1")[0] == path
    assert [list(engine.load_checkpoint("nothing"))] == DEEPSPEED["world1"]["missing_dir"] == [[None, None]]
    engine.close()


@pytest.mark.parametrize("saved", [1, 2, 3])
def test_a_deepspeed_checkpoint_gives_deepspeeds_path(saved):
    engine = deepspeed_fixture_engine(saved)
    path, _ = engine.load_checkpoint(str(ZERO[saved]))
    assert path == _theirs(1, f"stage{saved}", 0, str(ZERO[saved]), "global_step2")
    engine.close()


def _two_ranks(rank: int, world: int, folder: str) -> list:
    mine = {}
    for stage in (1, 3):
        engine = _engine(stage)
        engine.save_checkpoint(os.path.join(folder, f"s{stage}"), tag="t1")
        mine[f"stage{stage}"] = engine.load_checkpoint(os.path.join(folder, f"s{stage}"))[0]
        engine.close()
    engine = deepspeed_fixture_engine(3)
    mine["deepspeed"] = engine.load_checkpoint(str(ZERO[3]))[0]
    engine.close()
    every = [None] * world
    torch.distributed.all_gather_object(every, mine)
    return every


@pytest.mark.slow  # two ranks, three engines each
def test_two_ranks_each_name_their_own_file(tmp_path):
    every = run_ranks(_two_ranks, 2, str(tmp_path))
    for rank, mine in enumerate(every):
        for stage in (1, 3):
            assert mine[f"stage{stage}"] == os.path.join(tmp_path, f"s{stage}", "t1", f"rank_0000{rank}.safetensors")
        assert mine["deepspeed"] == _theirs(2, "stage3", rank, str(ZERO[3]), "global_step2")

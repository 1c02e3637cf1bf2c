"""`optimizer.state_dict()` / `load_state_dict()` on the optimizer `zero_core.deepspeed.initialize` returns: this
rank's partition as plain CPU tensors, loaded back into the same partition; anything else refused in one line
naming engine.save_checkpoint / load_checkpoint."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks
from parity_workers import ds_config, make_batches, make_model

import zero_core.deepspeed as deepspeed


def _initialize(stage: int, offload: bool = False):
    zero = {"offload_optimizer": {"device": "cpu"}} if offload else {}
    cfg = ds_config(stage, "bf16", 2, **zero)
    model = make_model()
    engine, optimizer, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine, optimizer


def _train(engine, batches, rank: int = 0) -> list[float]:
    losses = []
    for x, y in batches:
        xs, ys = (t[rank * 2 : rank * 2 + 2].to(engine.device) for t in (x, y))
        loss = engine(xs, ys).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def _plain(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.device.type == "cpu" and type(value) is torch.Tensor
    return value is None or isinstance(value, (bool, int, float, str))


@pytest.mark.parametrize("offload", [False, True])
def test_state_dict_round_trips_on_the_same_engine(offload):
    engine, optimizer = _initialize(2, offload)
    batches = make_batches(4, 2)
    _train(engine, batches[:2])
    saved = optimizer.state_dict()
    assert _plain(saved) and saved["zero_stage"] == 2 and saved["partition_count"] == 1
    assert saved["state"]["exp_avg"].abs().sum() > 0 and saved["applied"] == 2.0
    after = _train(engine, batches[2:])
    optimizer.load_state_dict(saved)
    assert optimizer.state_dict()["applied"] == 2.0
    assert _train(engine, batches[2:]) == after  # the same two steps again, from the same states


def test_other_dicts_are_refused_in_one_line():
    engine, optimizer = _initialize(2)
    _train(engine, make_batches(1, 2))
    saved = optimizer.state_dict()
    _, stage1 = _initialize(1)
    for bad, what in [(saved, "another partition"), (torch.optim.AdamW([torch.zeros(1)]).state_dict(), "only what"),
                      ({**saved, "state": {"master": torch.zeros(3)}}, "float32 tensors"),
                      ({**saved, "param_groups": [{"lr": "x"}]}, "param_groups")]:
        with pytest.raises(ValueError, match=what) as e:
            stage1.load_state_dict(bad) if bad is saved else optimizer.load_state_dict(bad)
        assert "engine.save_checkpoint" in str(e.value) and "\n" not in str(e.value)


def _two_ranks(rank: int, world: int) -> dict:
    engine, optimizer = _initialize(2)
    batches = make_batches(4, 2 * world)
    _train(engine, batches[:2], rank)
    saved = optimizer.state_dict()
    after = _train(engine, batches[2:], rank)
    optimizer.load_state_dict(saved)
    again = _train(engine, batches[2:], rank)
    other = [None] * world
    torch.distributed.all_gather_object(other, saved["partition_rank"])
    swapped = {**saved, "partition_rank": 1 - rank}  # the other rank's partition: refused
    try:
        optimizer.load_state_dict(swapped)
        refused = ""
    except ValueError as e:
        refused = str(e)
    return {"after": after, "again": again, "numel": saved["state"]["master"].numel(), "ranks": other,
            "refused": refused, "count": saved["partition_count"]}


@pytest.mark.slow
def test_each_rank_round_trips_its_own_partition():
    got = run_ranks(_two_ranks, 2)
    assert got["after"] == got["again"] and got["count"] == 2 and got["ranks"] == [0, 1]
    assert "another partition" in got["refused"] and "engine.load_checkpoint" in got["refused"]

"""The whole weights as DeepSpeed's engine hands them out: `_zero3_consolidated_16bit_state_dict` (Accelerate's
`get_state_dict` and transformers' saving call it at ZeRO-3) on rank 0 only, tied weights one tensor; and
`deepspeed.checkpoint.utils.clone_tensors_for_torch_save` (Accelerate's `get_state_dict` at stages 0-2)."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks
from parity_workers import ds_config, make_batches, make_model

import zero_core


def _consolidated(rank: int, world: int, stage: int) -> dict:
    engine = zero_core.initialize(make_model(), ds_config(stage, "bf16", 2))
    for x, y in make_batches(2, 2 * world):
        xs, ys = (t[2 * rank : 2 * rank + 2].to(engine.device) for t in (x, y))
        engine.backward(engine(xs, ys).loss)
        engine.step()
    out = {"whole": engine.module_state_dict()}
    try:
        state = engine._zero3_consolidated_16bit_state_dict()
        frozen_left_out = engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)
        out["state"] = state
        out["frozen_left_out"] = None if frozen_left_out is None else sorted(set(state) - set(frozen_left_out))
    except ValueError as e:
        out["refused"] = str(e)
    engine.close()
    return {"rank": rank, **out} if rank == 0 else {"rank": rank, **{k: v for k, v in out.items() if k != "whole"}}


def _both_ranks(rank: int, world: int, stage: int) -> list[dict]:
    import torch.distributed as dist

    mine = _consolidated(rank, world, stage)
    both = [None] * world
    dist.all_gather_object(both, {"rank": rank, "is_none": mine.get("state") is None,
                                  "refused": mine.get("refused")})
    return [mine, both]


@pytest.mark.slow
def test_rank_0_gets_the_whole_16bit_weights_and_the_others_none():
    mine, both = run_ranks(_both_ranks, 2, 3)
    state, whole = mine["state"], mine["whole"]
    assert [b["is_none"] for b in both] == [False, True]
    assert set(state) == set(whole) and all(torch.equal(state[k], whole[k]) for k in whole)
    assert state["wte.weight"].dtype == torch.bfloat16 and state["wte.weight"] is state["head.weight"]  # tied
    assert mine["frozen_left_out"] == ["blocks.0.ln1.bias"]


def test_it_is_a_stage_3_call():
    got = _consolidated(0, 1, 2)
    assert "needs ZeRO stage 3" in got["refused"] and "module_state_dict" in got["refused"]
    assert "\n" not in got["refused"]


def test_clone_tensors_for_torch_save_copies_every_tensor_it_holds():
    from zero_core.deepspeed.checkpoint.utils import clone_tensors_for_torch_save

    base = torch.arange(10.0)
    item = {"view": base[2:4], "nested": [base, (base, 3, "x")], "n": 1}
    out = clone_tensors_for_torch_save(item)
    assert torch.equal(out["view"], base[2:4]) and out["view"].untyped_storage().size() == 2 * 4  # its own values
    assert out["nested"][0] is not base and torch.equal(out["nested"][0], base)
    assert isinstance(out["nested"][1], tuple) and out["nested"][1][1:] == (3, "x") and out["n"] == 1
    base.add_(1)
    assert out["nested"][1][0][0] == 0  # copies, not views
    assert clone_tensors_for_torch_save(base, "meta").device.type == "meta"

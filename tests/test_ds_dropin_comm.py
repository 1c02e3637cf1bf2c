"""`deepspeed.comm.ReduceOp` is DeepSpeed's own enum (its members, numbers, repr and str; unequal to torch's), which
every collective of `zero_core.deepspeed.comm` takes beside torch's; `get_all_ranks_from_group` answers as DeepSpeed
0.19.8's: [] for None, the members' global ranks for a group, and here also every rank for the world's group, where
DeepSpeed's never returns. DeepSpeed's answers on 2 gloo ranks: tests/fixtures/ds_dropin_comm.json, made by
tests/fixtures/make_ds_dropin_comm.py, whose `answers` runs here on zero_core."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from dist_harness import run_ranks
from helpers import fixture_script

make = fixture_script("make_ds_dropin_comm")
DEEPSPEED = json.loads(make.PATH.read_text())


def _every_rank(rank: int, world: int) -> list:
    import zero_core.deepspeed as deepspeed
    import zero_core.deepspeed.comm as comm

    mine = fixture_script("make_ds_dropin_comm").answers(deepspeed)
    mine["ranks_of_world"] = comm.get_all_ranks_from_group(comm.get_world_group())
    # DeepSpeed's other collectives that take a reduction, given its enum
    scattered = torch.zeros(1)
    comm.reduce_scatter_tensor(scattered, torch.tensor([1.0, 2.0]) * (rank + 1), op=comm.ReduceOp.MAX)
    reduced = torch.tensor([rank + 2.0])
    comm.reduce(reduced, 0, op=comm.ReduceOp.PRODUCT)
    both = [torch.tensor([rank + 1.0]), torch.tensor([10.0 * rank])]
    comm.all_reduce_coalesced(both, op=comm.ReduceOp.SUM)
    mine["other_collectives"] = [scattered.item(), reduced.item() if rank == 0 else None, [x.item() for x in both]]
    every = [None] * world
    dist.all_gather_object(every, mine)
    return every


@pytest.mark.slow  # two ranks
def test_two_ranks_answer_as_deepspeeds():
    every = run_ranks(_every_rank, 2)
    for rank, (ours, theirs) in enumerate(zip(every, DEEPSPEED["ranks"])):
        assert ours.pop("ranks_of_world") == [0, 1]  # DeepSpeed's call never returns for the world's group
        assert ours.pop("other_collectives") == [[2.0, 4.0][rank], 2.0 * 3.0 if rank == 0 else None, [3.0, 10.0]]
        assert ours == theirs


def test_reduce_op_is_deepspeeds_enum():
    import zero_core.deepspeed.comm as comm

    theirs = DEEPSPEED["ranks"][0]
    assert comm.ReduceOp is not dist.ReduceOp and [op.name for op in comm.ReduceOp] == theirs["members"]
    for op in comm.ReduceOp:
        assert make._op(op) == theirs["ops"][op.name]
    assert comm.ReduceOp(3) is comm.ReduceOp.MAX and theirs["by_value"] == "MAX"


def test_a_world_of_one_takes_either_enum_and_has_no_group_ranks():
    import zero_core.deepspeed.comm as comm

    assert not dist.is_initialized()
    for op in (comm.ReduceOp.AVG, dist.ReduceOp.MAX):
        t = torch.tensor([1.0, 2.0])
        comm.all_reduce(t, op=op)
        comm.inference_all_reduce(t, op=op)
        comm.reduce(t, 0, op=op)
        assert t.tolist() == [1.0, 2.0]
    out = torch.zeros(2)
    comm.reduce_scatter_tensor(out, torch.tensor([5.0, 6.0]), op=comm.ReduceOp.SUM)
    assert out.tolist() == [5.0, 6.0]
    assert comm.get_all_ranks_from_group() == comm.get_all_ranks_from_group(None) == []  # as DeepSpeed's, for None
    with pytest.raises(ValueError, match=r"^deepspeed\.comm\.ReduceOp\.UNUSED names no reduction; pass SUM"):
        comm.all_reduce(torch.zeros(1), op=comm.ReduceOp.UNUSED)

"""`deepspeed.utils.safe_get_full_grad(param)` inside an accumulation window (after a backward that does not end it,
before and after that micro-step's `step()`) at ZeRO stages 0 and 1 gives what DeepSpeed 0.19.8's gives there:
this rank's gradients summed so far, each micro-step's divided by the accumulation steps, in the parameter's dtype
(bf16 under bf16), without communication; at stage 2 it is refused, as on one DeepSpeed rank (on two DeepSpeed's
ranks disagree and the run dies). tests/fixtures/deepspeed_mid_window_grads.json, made by
tests/fixtures/make_dropin_mid_window_grads.py with the same model, batches and loop, on 1 and 2 ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dist_harness import run_ranks
from helpers import fixture_script

FIXTURES = Path(__file__).parent / "fixtures"
DEEPSPEED = json.loads((FIXTURES / "deepspeed_mid_window_grads.json").read_text())
make = fixture_script("make_dropin_mid_window_grads")


def _traces(rank: int, world: int) -> dict:
    import zero_core.deepspeed as deepspeed
    from zero_core.deepspeed.utils import safe_get_full_grad

    mine = {f"stage{s}_{p}": make.trace(deepspeed, safe_get_full_grad, s, p, rank) for s, p in make.cases(world)}
    if world == 1:
        return {case: [reads] for case, reads in mine.items()}
    every = [None] * world
    torch.distributed.all_gather_object(every, mine)
    return {case: [ranks[case] for ranks in every] for case in mine}


def _same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for case, ranks in want.items():
        assert len(got[case]) == len(ranks)
        for rank, (mine, theirs) in enumerate(zip(got[case], ranks)):
            for read, expected in theirs.items():
                seen = mine[read]
                if "raises" in expected:
                    assert seen == expected, (case, rank, read, seen)
                    continue
                assert seen["dtype"] == expected["dtype"], (case, rank, read, seen["dtype"])
                # bitwise here; a tolerance for other CPUs' kernels
                assert seen["values"] == pytest.approx(expected["values"], rel=1e-6, abs=1e-9), (case, rank, read)


def test_one_rank_reads_deepspeeds_sums_so_far():
    _same(_traces(0, 1), DEEPSPEED["world1"])


def test_two_ranks_each_read_their_own_sums_as_deepspeeds():
    _same(run_ranks(_traces, 2), DEEPSPEED["world2"])

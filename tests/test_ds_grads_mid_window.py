"""A parameter's gradient inside an accumulation window (after a backward that does not end it, before and after
that micro-step's `step()`) and at its boundary, as DeepSpeed 0.19.8 gives it on 2 ranks, fp32 and bf16:

- `.grad`: at stages 0-1 this rank's sum so far, in the parameter's dtype (DeepSpeed accumulates in it); at the
  boundary the rank-averaged gradient at stage 0 (bf16 too), None from stage 1 on; None throughout at stages 2-3;
- `safe_get_full_grad`: at stage 3 the rank-averaged sum so far, fp32 (as its ZeRO-3 gradient partition holds it);
  at stage 0 under bf16 the boundary's gradient in bf16 (DeepSpeed's `.grad` there);
- `safe_get_local_grad`: at stage 3 this rank's share of that sum. zero_core's shares are not DeepSpeed's (its
  partitions have equal sizes and padding): the ranks' shares in order make up the parameter, as DeepSpeed's do
  without their padding. At stages 0-2 DeepSpeed's refuses it (ZeRO-3 only); zero_core's refuses it inside the
  window in one line, and at the boundary gives its share of the full gradient.

tests/fixtures/deepspeed_grads_mid_window.json, made by tests/fixtures/make_ds_grads_mid_window.py with the same
model, batches and loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dist_harness import run_ranks
from helpers import fixture_script

FIXTURES = Path(__file__).parent / "fixtures"
DEEPSPEED = json.loads((FIXTURES / "deepspeed_grads_mid_window.json").read_text())
make = fixture_script("make_ds_grads_mid_window")


def _one_line_local(local):
    """safe_get_local_grad, its refusals checked to be one line."""

    def read(param):
        try:
            return local(param)
        except ValueError as e:
            assert "\n" not in str(e) and "safe_get_local_grad" in str(e), str(e)
            raise

    return read


def _traces(rank: int, world: int, stage: int, offload: bool = False) -> dict:
    import zero_core.deepspeed as deepspeed
    from zero_core.deepspeed.utils import safe_get_full_grad, safe_get_local_grad

    if offload:  # the window's sums then wait in host memory; the gradients are the same
        plain = make.config
        make.config = lambda *a: {**plain(*a), "zero_optimization": {**plain(*a)["zero_optimization"],
                                                                     "offload_optimizer": {"device": "cpu"}}}
    local = _one_line_local(safe_get_local_grad)
    mine = {f"stage{stage}_{p}": make.trace(deepspeed, local, safe_get_full_grad, stage, p, rank)
            for p in ("fp32", "bf16")}
    every = [None] * world
    torch.distributed.all_gather_object(every, mine)
    return {case: [ranks[case] for ranks in every] for case in mine}


def _same_read(seen: dict | None, expected: dict | None, where: tuple) -> None:
    if expected is None or "values" not in expected:
        assert seen == expected, (where, seen)
        return
    assert seen is not None and seen.get("dtype") == expected["dtype"], (where, seen)
    # bitwise here; a tolerance for other CPUs' kernels
    assert seen["values"] == pytest.approx(expected["values"], rel=1e-6, abs=1e-9), (where, seen)


def _local_shares(ranks: list[dict], point: str) -> list[float]:
    return [v for reads in ranks for v in reads[point]["local"]["values"]]


@pytest.mark.parametrize("stage, offload", [(0, False), (1, False), (2, False), (3, False), (3, True)])
def test_grads_inside_the_window_and_at_its_end_are_deepspeeds(stage, offload):
    got = run_ranks(_traces, 2, stage, offload)
    for case, theirs in DEEPSPEED.items():
        if not case.startswith(f"stage{stage}_"):
            continue
        mine = got[case]
        for rank in range(2):
            for point, reads in theirs[rank].items():
                _same_read(mine[rank][point]["grad"], reads["grad"], (case, rank, point, "grad"))
                _same_read(mine[rank][point]["full"], reads["full"], (case, rank, point, "full"))
        for point in theirs[0]:
            if stage == 3:  # the ranks' shares in order: DeepSpeed's without its padding
                want = _local_shares(theirs, point)[: len(theirs[0][point]["full"]["values"])]
                assert _local_shares(mine, point) == pytest.approx(want, rel=1e-6, abs=1e-9), (case, point)
            elif point != "boundary":
                assert all(r[point]["local"] == {"raises": "ValueError"} for r in mine), (case, point)
                assert all(r[point]["local"] == {"raises": "AssertionError"} for r in theirs), (case, point)
            else:  # zero_core's beyond DeepSpeed's: shares of the boundary's full gradient (stage 0: all of it)
                want = theirs[0][point]["full"]["values"]
                shares = [_local_shares([r], point) for r in mine] if stage == 0 else [_local_shares(mine, point)]
                assert all(got == pytest.approx(want, rel=1e-6, abs=1e-9) for got in shares), (case, point)

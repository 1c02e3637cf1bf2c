"""Stage 0 in fp32 steps a parameter the script froze after `initialize` as DeepSpeed 0.19.8's torch AdamW does: not
at all while its `.grad` is None (no weight decay, no moment or step-count update), and from its own step count
again once unfrozen; a `.grad` the script sets to None before `step()` skips that parameter in that step alone.

tests/fixtures/deepspeed_stage0_frozen.json, made by tests/fixtures/make_stage0_frozen.py with the same model,
batches and loop. Where zero_core differs: `optimizer.state[p]["step"]` reads the engine's one count, not the
parameter's (the fixture's `adam_steps`), so that is not compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist_harness import run_ranks
from helpers import fixture_script

DEEPSPEED = json.loads((Path(__file__).parent / "fixtures" / "deepspeed_stage0_frozen.json").read_text())
make = fixture_script("make_stage0_frozen")


def _traces(rank: int, world: int) -> dict:
    import zero_core.deepspeed as deepspeed

    return {case: make.trace(deepspeed, case, rank) for case in make.CASES}


@pytest.mark.parametrize("world", [1, 2])
def test_a_parameter_frozen_mid_run_is_stepped_as_deepspeeds_stage0(world):
    got = run_ranks(_traces, world)
    for case, theirs in DEEPSPEED[f"world{world}"].items():
        mine = got[case]
        assert mine["weight_grad_none"] == theirs["weight_grad_none"], case
        for step, (seen, want) in enumerate(zip(mine["values"], theirs["values"])):
            for name in want:  # bitwise: the same torch AdamW arithmetic on the same gradients
                assert seen[name] == pytest.approx(want[name], rel=1e-6, abs=1e-9), (case, make.RECORDED[step], name)

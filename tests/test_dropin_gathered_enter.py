"""`deepspeed.zero.GatheredParameters(...).__enter__()` returns None, as DeepSpeed 0.19.8's does for params None, one
parameter, a list or a generator, with or without `modifier_rank`, without an engine and at ZeRO stages 0 and 3
(`with ... as x` binds None); and still gathers (tests/fixtures/deepspeed_gathered_enter.json, made by
tests/fixtures/make_dropin_gathered_enter.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import zero_core.deepspeed as deepspeed
from helpers import fixture_script

FIXTURES = Path(__file__).parent / "fixtures"
DEEPSPEED = json.loads((FIXTURES / "deepspeed_gathered_enter.json").read_text())
make = fixture_script("make_dropin_gathered_enter")


def test_enter_and_exit_return_what_deepspeeds_return():
    got: dict = {"deepspeed": DEEPSPEED["deepspeed"]}
    make.record(deepspeed, torch.nn.Linear(4, 3), "no_engine", got)
    for stage in (0, 3):
        make.record(deepspeed, make.engine_module(deepspeed, stage), f"stage{stage}", got)
    assert got == DEEPSPEED


def test_the_context_still_gathers_and_keeps_a_modifier_ranks_write():
    module = make.engine_module(deepspeed, 3)
    with deepspeed.zero.GatheredParameters([module.weight], modifier_rank=0) as bound:
        assert bound is None and module.weight.shape == (3, 4)
        module.weight.data.fill_(0.5)
    with deepspeed.zero.GatheredParameters(module.weight):
        assert torch.all(module.weight == 0.5)

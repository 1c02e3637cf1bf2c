"""`loss = engine.backward(loss)` returns what DeepSpeed 0.19.8's returns: the loss divided by the accumulation
steps (the micro-batch's share of the window's loss), or the loss itself with `scale_wrt_gas=False`, still part of
the graph, at ZeRO stages 0, 1 and 3 (DeepSpeed's values in tests/fixtures/deepspeed_backward_return.json, made by
tests/fixtures/make_dropin_backward_return.py with the same model, batches and config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zero_core.deepspeed as deepspeed
from helpers import fixture_script

FIXTURES = Path(__file__).parent / "fixtures"
DEEPSPEED = json.loads((FIXTURES / "deepspeed_backward_return.json").read_text())
make = fixture_script("make_dropin_backward_return")


@pytest.mark.parametrize("scale_wrt_gas", [True, False])
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_backward_returns_deepspeeds_value(stage, scale_wrt_gas):
    got = make.run(deepspeed, stage, scale_wrt_gas)
    want = DEEPSPEED[f"stage{stage}_scale_wrt_gas_{scale_wrt_gas}"]
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], abs=1e-6)
        assert g["returned"] == pytest.approx(w["returned"], abs=1e-6)
        assert g["requires_grad"] == w["requires_grad"]


def test_the_returned_loss_is_the_given_one_without_accumulation():
    """With one micro-batch per step the division is by 1: the loss passed in comes back, as a script compares."""
    net = make.model()
    cfg = dict(make.config(1), gradient_accumulation_steps=1)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    x, y = make.batches(1)[0]
    loss = torch.nn.functional.mse_loss(engine(x), y)
    assert engine.backward(loss) is loss
    engine.close()

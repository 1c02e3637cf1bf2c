"""`deepspeed.checkpointing` calls scripts make beside `checkpoint(fn, *args)`: keyword arguments to the
checkpointed function, `non_reentrant_checkpoint`, and `reset()` / `set_num_layers()` /
`partition_activations_in_checkpoint()` between steps give DeepSpeed 0.19.8's outputs, gradients and return values
(tests/fixtures/deepspeed_checkpointing_calls.json, made by tests/fixtures/make_dropin_checkpointing_calls.py with
the same block and inputs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zero_core.deepspeed as deepspeed
from helpers import fixture_script

FIXTURES = Path(__file__).parent / "fixtures"
DEEPSPEED = json.loads((FIXTURES / "deepspeed_checkpointing_calls.json").read_text())
make = fixture_script("make_dropin_checkpointing_calls")


@pytest.mark.parametrize("call", ["checkpoint_kwargs", "non_reentrant_checkpoint"])
def test_outputs_and_gradients_are_deepspeeds(call):
    got, want = make.measure(deepspeed.checkpointing, call), DEEPSPEED[call]
    assert got["out"] == pytest.approx(want["out"], abs=1e-6)
    assert got["grads"].keys() == want["grads"].keys()
    for name, grad in want["grads"].items():
        assert got["grads"][name] == pytest.approx(grad, abs=1e-6), name


def test_the_buffer_calls_return_what_deepspeeds_return():
    ck = deepspeed.checkpointing
    got = {"reset": repr(ck.reset()), "set_num_layers": repr(ck.set_num_layers(4)),
           "partition_activations_in_checkpoint": repr(ck.partition_activations_in_checkpoint(False))}
    assert got == DEEPSPEED["returns"]

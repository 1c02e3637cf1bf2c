"""engine.step() that ends an accumulation window whose last backward did not run is refused in one line, and
changes nothing: DeepSpeed's fails inside its optimizer there, and an update from no gradients would still decay the
weights and move the moments. Steps inside a window only count, as before."""

from __future__ import annotations

import pytest
import torch

import zero_core
from parity_workers import ds_config, make_batches, make_model


def _weights(engine) -> list[torch.Tensor]:
    return [t.clone() for t in engine.full_state_dict().values()]


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_step_with_no_backward_is_refused_and_changes_nothing(stage):
    engine = zero_core.initialize(make_model(), ds_config(stage, "fp32", 2))
    before, steps = _weights(engine), engine.global_steps
    with pytest.raises(ValueError, match="call engine.backward\\(loss\\) before each engine.step\\(\\)") as refused:
        engine.step()
    assert "\n" not in str(refused.value)
    assert engine.global_steps == steps and engine.micro_steps == 0
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(engine)))
    x, y = (t.to(engine.device) for t in make_batches(1, 2)[0])
    engine.backward(engine(x, y).loss)
    engine.step()  # the same engine trains on as usual
    assert engine.global_steps == steps + 1
    with pytest.raises(ValueError, match="last backward did not run"):
        engine.step()  # right after an update, the window is new again


def test_inside_a_window_a_step_counts_but_the_boundary_needs_its_backward():
    engine = zero_core.initialize(make_model(), ds_config(2, "fp32", 2, gas=2))
    x, y = (t.to(engine.device) for t in make_batches(1, 2)[0])
    engine.backward(engine(x, y).loss)
    engine.step()  # micro-step 1 of 2: counted, no update
    assert engine.micro_steps == 1 and engine.global_steps == 0
    with pytest.raises(ValueError, match="last backward did not run"):
        engine.step()  # the boundary, without its backward
    engine.backward(engine(x, y).loss)
    engine.step()
    assert engine.global_steps == 1

"""Stages 2-3 copy each gradient into a fresh, uninitialised bucket buffer: the padding and the slots of
parameters that got no gradient must still reduce as zeros. Buffers are poisoned with NaN here, so any
byte left unwritten would make the step non-finite (and skipped) or change the weights."""

from __future__ import annotations

import pytest
import torch

from dist_harness import run_ranks
from parity_workers import ds_config, make_batches, make_model


def _train(rank: int, world: int, stage: int, poison: bool) -> dict:
    import zero_core
    from zero_core.grad_reducer import GradReducer

    if poison:
        GradReducer._uninitialised = lambda self, numel: torch.full((numel,), float("nan"), dtype=self.comm_dtype,
                                                                    device=self.device)
    model = make_model()
    model.unused = torch.nn.Linear(5, 3)  # trainable, never called: no gradient ever arrives
    micro = 2
    engine = zero_core.initialize(model, ds_config(stage, "fp32", micro, gas=2))
    losses = []
    for x, y in make_batches(6, micro * world):
        xs, ys = (t[rank * micro : (rank + 1) * micro].to(engine.device) for t in (x, y))
        loss = engine(xs, ys).loss
        losses.append(float(loss.detach()))
        engine.backward(loss)
        engine.step()
    out = {"losses": losses, "skipped": engine.skipped_steps,
           "state": {k: v.cpu() for k, v in engine.full_state_dict().items()}}
    engine.close()
    return out


@pytest.mark.parametrize("stage", [2, 3])
def test_unwritten_bucket_bytes_reduce_as_zeros(stage):
    clean = run_ranks(_train, 2, stage, False)
    poisoned = run_ranks(_train, 2, stage, True)
    assert poisoned["skipped"] == clean["skipped"] == 0
    assert poisoned["losses"] == clean["losses"]
    for k, v in clean["state"].items():
        assert torch.equal(poisoned["state"][k], v), k
    # the unused layer only decays (zero gradient): AdamW with zero moments moves it by weight decay alone
    init = make_model()
    init.unused = torch.nn.Linear(5, 3)
    assert not torch.equal(clean["state"]["unused.weight"], init.unused.weight.detach())

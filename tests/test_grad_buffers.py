"""Stages 2-3 copy each gradient into a fresh, uninitialised bucket buffer: the padding and the slots of
parameters that got no gradient must still reduce as zeros. Buffers are poisoned with NaN here, so any
byte left unwritten would make the step non-finite (and skipped) or change the weights."""

from __future__ import annotations

import math

import pytest
import torch

from dist_harness import run_ranks
from parity_workers import ds_config, make_model, train_local

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def _train(rank: int, world: int, stage: int, poison: bool) -> dict:
    import zero_core
    from zero_core.stages.grad_buckets import GradReducer

    if poison:
        GradReducer._uninitialised = lambda self, numel: torch.full((numel,), float("nan"), dtype=self.comm_dtype,
                                                                    device=self.device)
    model = make_model()
    model.unused = torch.nn.Linear(5, 3)  # trainable, never called: no gradient ever arrives
    micro = 2
    engine = zero_core.initialize(model, ds_config(stage, "fp32", micro, gas=2))
    losses = train_local(engine, rank, world, micro, 6)
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


def _bucket_at_first_gradient(rank: int, world: int, stage: int) -> dict:
    """Watch the reducer right after the first gradient of a many-parameter group has arrived."""
    import zero_core

    model = make_model()
    micro = 2
    # one large bucket (stage 2) / the block units (stage 3): groups that fill over much of backward
    engine = zero_core.initialize(model, ds_config(stage, "fp32", micro, reduce_bucket_size=10**8))
    red = engine.reducer
    index = {id(p): i for i, p in enumerate(engine.params)}
    seen: list[dict] = []

    def watch(p: torch.Tensor) -> None:
        slot = red.layout.slots[index[id(p)]]
        group = red.layout.groups[slot.group]
        if red.arrived[slot.group] == 1 and len(group.slots) > 1:
            held = sum(g.numel() for _, g in getattr(red, "_pending", {}).get(slot.group, ()))
            seen.append({"allocated": red.buffers[slot.group] is not None, "held": held, "numel": slot.numel,
                         "bucket": group.padded_numel})

    for p in engine.params:
        p.register_post_accumulate_grad_hook(watch)  # runs after the reducer's own hook
    (loss,) = train_local(engine, rank, world, micro, 1)
    out = {"seen": seen, "pending_after": len(getattr(red, "_pending", {})), "losses_finite": math.isfinite(loss)}
    engine.close()
    return out


@pytest.mark.parametrize("stage", [2, 3])
def test_a_bucket_is_allocated_when_complete_not_at_its_first_gradient(stage):
    """Stages 2-3 hold a group's gradients as autograd made them and build the flat bucket once the group is
    complete: a 5e8-element bucket allocated at backward's first gradient sat on top of every activation."""
    out = run_ranks(_bucket_at_first_gradient, 2, stage)
    assert out["seen"], "no group with several parameters was watched"
    for s in out["seen"]:
        assert not s["allocated"], s
        assert s["held"] == s["numel"] < s["bucket"], s  # only the arrived gradient is held
    assert out["pending_after"] == 0 and out["losses_finite"]

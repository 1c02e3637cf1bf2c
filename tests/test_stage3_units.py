"""Stage 3 gathers block-sized units around their forward and releases them afterwards."""

from __future__ import annotations

import torch

import zero_core
from parity_workers import ds_config, make_batches, make_model


def _engine(stage: int, **zero):
    return zero_core.initialize(make_model(), ds_config(stage, "fp32", 2, **zero))


def test_units_are_blocks_and_leaf_modules():
    engine = _engine(3)
    names = [tuple(s.name for s in g.slots) for g in engine.layout.groups]
    block0 = [n for n in names if n[0].startswith("blocks.0.")]
    assert len(block0) == 1 and len(block0[0]) == 11  # every trainable tensor of block 0 (ln1.bias is frozen)
    assert ("wte.weight",) in names and not any("head.weight" in n for n in names)  # tied head has no copy


def test_weights_released_between_uses_and_eval_matches_stage_2():
    s3 = _engine(3, stage3_param_persistence_threshold=0)
    s2 = _engine(2)
    x, y = make_batches(1, 2)[0]
    for engine in (s3, s2):
        engine.backward(engine(x, y).loss)
        engine.step()
    gatherer = s3.gatherer
    assert all(buf.untyped_storage().size() == 0 for buf in gatherer.full)  # nothing held after the step
    with torch.no_grad():
        a, b = s3(x).logits, s2(x).logits
    assert torch.allclose(a, b, atol=1e-6)
    assert all(buf.untyped_storage().size() == 0 for buf in gatherer.full)  # eval released them again
    assert gatherer.live_numel == 0


def test_persistence_threshold_keeps_small_units():
    engine = _engine(3, stage3_param_persistence_threshold=100)
    x, y = make_batches(1, 2)[0]
    engine.backward(engine(x, y).loss)
    engine.step()
    engine(x)
    kept = [g.numel < 100 for g in engine.layout.groups]
    held = [buf.untyped_storage().size() > 0 for buf in engine.gatherer.full]
    assert any(kept) and held == kept

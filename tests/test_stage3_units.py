"""Stage 3 gathers block-sized units around their forward and releases them afterwards."""

from __future__ import annotations

import torch

import zero_core
from parity_workers import ds_config, make_batches, make_model


def _engine(stage: int, **zero):
    return zero_core.initialize(make_model(), ds_config(stage, "fp32", 2, **zero))


def test_units_are_blocks_plus_one_root_unit():
    engine = _engine(3)
    names = [tuple(s.name for s in g.slots) for g in engine.layout.groups]
    block0 = [n for n in names if n[0].startswith("blocks.0.")]
    assert len(block0) == 1 and len(block0[0]) == 11  # every trainable tensor of block 0 (ln1.bias is frozen)
    assert names[0] == (
        "wte.weight",
        "wpe.weight",
        "ln_f.weight",
        "ln_f.bias",
    )  # the root unit; the tied head has no copy
    assert len(names) == 1 + len(engine.module.blocks)


def test_parameter_read_outside_its_module_forward():
    """Like DeBERTa's relative-position table: a parent reads a child's weight without calling it."""

    class Reader(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Embedding(5, 4)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x @ self.table.weight.T @ self.table.weight  # never calls self.table(...)
            for b in self.blocks:
                h = b(h)
            return h

    torch.manual_seed(0)
    ref = Reader()
    model = Reader()
    model.load_state_dict(ref.state_dict())
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    engine = zero_core.initialize(model, cfg)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    x = torch.randn(2, 4)
    for _ in range(3):
        engine.backward(engine(x).square().mean())
        engine.step()
        ref(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    got = engine.full_state_dict()
    for k, v in ref.state_dict().items():
        assert torch.allclose(got[k], v, atol=1e-6), k


def test_weights_released_between_uses_and_eval_matches_stage_2():
    s3 = _engine(3, stage3_param_persistence_threshold=0)
    s2 = _engine(2)
    x, y = make_batches(1, 2)[0]
    for engine in (s3, s2):
        engine.backward(engine(x, y).loss)
        engine.step()
    gatherer = s3.strategy.gatherer
    assert all(buf.untyped_storage().size() == 0 for buf in gatherer.full)  # nothing held after the step
    with torch.no_grad():
        a, b = s3(x).logits, s2(x).logits
    assert torch.allclose(a, b, atol=1e-6)
    assert all(buf.untyped_storage().size() == 0 for buf in gatherer.full)  # eval released them again
    assert gatherer.live_numel == 0


def test_persistence_threshold_keeps_small_units():
    engine = _engine(3, stage3_param_persistence_threshold=2000)  # the root unit (1100) stays, blocks go
    x, y = make_batches(1, 2)[0]
    engine.backward(engine(x, y).loss)
    engine.step()
    with torch.no_grad():  # a training forward would also keep the last blocks for backward (reuse distance)
        engine(x)
    kept = [g.numel < 2000 for g in engine.layout.groups]
    held = [buf.untyped_storage().size() > 0 for buf in engine.strategy.gatherer.full]
    assert any(kept) and held == kept


def _held(engine) -> list[int]:
    return [u for u, buf in enumerate(engine.strategy.gatherer.full) if buf.untyped_storage().size() > 0]


def test_reuse_distance_keeps_the_last_blocks_between_forward_and_backward():
    """DeepSpeed's stage3_max_reuse_distance: a block whose backward comes within that many gathered elements
    stays gathered after its forward; backward does not gather it again, and the training is the same."""
    last = _engine(3).layout.groups[-1].padded_numel
    # the last block's backward follows its forward at once (distance 0); the one before it has the last block's
    # forward and backward in between (2 x last elements): only the last block is kept
    reuse = _engine(3, stage3_param_persistence_threshold=0, stage3_max_reuse_distance=last)
    plain = _engine(3, stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0)
    final = len(reuse.layout.groups) - 1
    gathered: list[int] = []
    gatherer = reuse.strategy.gatherer
    real = gatherer._gather_into
    gatherer._gather_into = lambda g, lo, hi: (gathered.append(g), real(g, lo, hi))[1]
    for step, (x, y) in enumerate(make_batches(3, 2)):
        for engine in (reuse, plain):
            loss = engine(x, y).loss
            if engine is reuse:
                assert _held(reuse) == ([] if step == 0 else [final])  # step 0 records the order
                gathered.clear()
            engine.backward(loss)
            if engine is reuse and step > 0:
                assert final not in gathered
                assert final - 1 in gathered  # the block before it went after its forward and came back
            engine.step()
        assert _held(reuse) == [] and gatherer.live_numel == 0
    a, b = reuse.full_state_dict(), plain.full_state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_reuse_distance_within_max_live_parameters():
    block = _engine(3).layout.groups[1].padded_numel
    engine = _engine(3, stage3_param_persistence_threshold=0, stage3_max_reuse_distance=10 * block,
                     stage3_max_live_parameters=1)  # no room to keep any unit
    for x, y in make_batches(2, 2):
        loss = engine(x, y).loss
        assert _held(engine) == []
        engine.backward(loss)
        engine.step()
    engine = _engine(3, stage3_param_persistence_threshold=0, stage3_max_reuse_distance=10 * block)
    engine.backward(engine(x, y).loss)
    engine.step()
    with torch.no_grad():  # an evaluation forward keeps nothing: no backward follows it
        engine(x)
    assert _held(engine) == []
    engine(x)  # a training forward keeps every unit: all are within 10 blocks of their backward
    assert _held(engine) == list(range(len(engine.layout.groups)))

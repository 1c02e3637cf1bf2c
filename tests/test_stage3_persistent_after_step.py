"""Stage 3: a unit kept whole (under `stage3_param_persistence_threshold`) read after `step()`, outside any
forward, holds the step's new weights, as DeepSpeed's persistent parameters do (they are gathered at the end of
its step).

- Plain step (the default): the units are gathered again at the end of `step()`, on every rank.
- Optimizer offload with `zero_core.overlap_weight_gather` (the update still runs when `step()` returns): on one
  rank a read waits for the unit's update and copies it in (no peer needed); on two, a read is refused in one line
  naming GatheredParameters, inside which it gets the new weights. Each case runs in forked ranks."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks
from torch import nn


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = torch.tanh(b(x))
        return self.head(x).pow(2).mean()


def _engine(overlap: bool):
    import zero_core.deepspeed as deepspeed

    zero = {"stage": 3}  # the default persistence threshold keeps these small units whole
    if overlap:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
           "zero_core": {"overlap_weight_gather": overlap}}
    torch.manual_seed(0)
    model = _Net()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine, model


def _after_steps(rank: int, world: int, overlap: bool) -> dict:
    from zero_core.deepspeed import zero
    from zero_core.deepspeed.utils import safe_get_full_fp32_param

    engine, model = _engine(overlap)
    assert all(engine.strategy.gatherer.persistent), "the test needs every unit kept whole"
    gen = torch.Generator().manual_seed(rank)
    out = {"moved": [], "plain": [], "gathered": [], "refused": []}
    for _ in range(3):
        loss = engine(torch.randn(2, 8, generator=gen).to(engine.device))
        engine.backward(loss)
        before = model.blocks[1].bias.detach().cpu().clone() if not (overlap and world > 1) else None
        engine.step()
        expected = safe_get_full_fp32_param(model.blocks[1].bias).cpu()
        if before is not None:
            out["moved"].append((expected - before).abs().max().item())
        try:
            out["plain"].append((model.blocks[1].bias.detach().cpu() - expected).abs().max().item())
        except ValueError as e:  # refused: the unit's update may still run, and gathering needs every rank
            out["refused"].append(str(e))
        with zero.GatheredParameters([model.blocks[1].bias]):
            out["gathered"].append((model.blocks[1].bias.detach().cpu() - expected).abs().max().item())
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_kept_units_hold_the_new_weights_after_a_plain_step(world: int) -> None:
    out = run_ranks(_after_steps, world, False)
    assert min(out["moved"]) > 1e-4  # the step changed the weights: a stale copy would differ
    assert out["plain"] == [0.0, 0.0, 0.0] and out["gathered"] == [0.0, 0.0, 0.0]


def test_kept_units_wait_for_the_overlapped_update_on_one_rank() -> None:
    out = run_ranks(_after_steps, 1, True)
    assert min(out["moved"]) > 1e-4
    assert out["plain"] == [0.0, 0.0, 0.0] and out["gathered"] == [0.0, 0.0, 0.0]


def test_kept_units_refuse_a_read_while_the_overlapped_update_runs_on_two_ranks() -> None:
    out = run_ranks(_after_steps, 2, True)
    assert out["plain"] == [] and len(out["refused"]) == 3
    assert all("\n" not in m and "blocks.1.bias" in m and "GatheredParameters" in m for m in out["refused"])
    assert out["gathered"] == [0.0, 0.0, 0.0]

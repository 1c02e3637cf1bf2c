"""Blocks nested in containers, as `layers = ModuleList([ModuleList([attn, ff]) ...])` looped as
`for attn, ff in self.layers` (or a ModuleDict per layer): the containers are never called, so their children are
the units gathered at stage 3 (and waited for with overlapped gathers at stages 1-2). On 2 gloo ranks every stage
trains as stage 0 does."""

from __future__ import annotations

import pytest
import torch

from dist_harness import run_ranks

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier


class Nested(torch.nn.Module):
    def __init__(self, width: int = 8, depth: int = 2) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.ModuleList([torch.nn.Linear(width, width), torch.nn.Linear(width, width)]) for _ in range(depth)]
            + [torch.nn.ModuleDict({"mix": torch.nn.Linear(width, width)})])
        self.scales = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(width))])  # read, not called
        self.out = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            for block in (layer.values() if isinstance(layer, torch.nn.ModuleDict) else layer):
                x = torch.tanh(block(x)) + x
        return self.out(x * self.scales[0]).pow(2).mean()


def _losses(rank: int, world: int) -> dict:
    import zero_core

    got = {}
    for stage in (0, 2, 3):
        torch.manual_seed(0)
        cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage,
               "stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 0},
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_core": {"overlap_weight_gather": True}}
        engine = zero_core.initialize(Nested(), cfg)
        gen = torch.Generator().manual_seed(1 + rank)
        losses = []
        for _ in range(3):
            loss = engine(torch.randn(2, 8, generator=gen).to(engine.device))
            engine.backward(loss)
            engine.step()
            losses.append(float(loss))
        got[stage] = losses
        engine.close()
    return got


def test_blocks_inside_containers_train_at_every_stage_as_at_stage_0():
    got = run_ranks(_losses, 2)
    assert got[2] == pytest.approx(got[0], rel=1e-6) and got[3] == pytest.approx(got[0], rel=1e-6)

"""Stage 0 under bf16 leaves the boundary's rank-averaged gradient in `.grad` (bf16 views of the reduced buckets, as
DeepSpeed 0.19.8's `.grad` holds it there: its values are pinned in tests/test_ds_grads_mid_window.py), the step takes
it as the script left it (DeepSpeed's optimizer reads `.grad`; None reads as zeros), and `.grad` is None after the
step. The buckets keep that average until the next window's gradients are copied over it: the sums of later windows,
parameters some micro-steps leave unused included, are the ones stage 1 (whose buckets are zeroed) makes."""

from __future__ import annotations

import pytest
import torch

from dist_harness import run_ranks


class TwoHeads(torch.nn.Module):
    """A trunk and two heads: `head` picks which one a micro-step uses (the other gets no gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
        self.unused = torch.nn.Linear(2, 2)  # never called: its gradient is zeros, as DeepSpeed's

    def forward(self, x: torch.Tensor, head: str) -> torch.Tensor:
        return getattr(self, head)(torch.tanh(self.trunk(x)))


def _engine(stage: int, gas: int, weight_decay: float = 0.0):
    from zero_core import deepspeed

    torch.manual_seed(0)
    model = TwoHeads()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas, "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": weight_decay}},
        "zero_optimization": {"stage": stage}, "bf16": {"enabled": True}})
    return engine


def _edited_step(rank: int, world: int, change: str) -> dict:
    from zero_core.deepspeed.utils import safe_get_full_grad

    engine = _engine(0, 1)
    before = [p.detach().clone() for p in engine.module.parameters()]
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(rank)).to(engine.device, torch.bfloat16)
    engine.backward(engine(x, "a").float().pow(2).mean())
    grads = [p.grad for p in engine.module.parameters()]
    shown = all(g is not None and g.dtype == torch.bfloat16 and torch.equal(g, safe_get_full_grad(p))
                for p, g in zip(engine.module.parameters(), grads))
    unused_zeros = all(not p.grad.any() for p in engine.module.unused.parameters())
    for p in engine.module.parameters():
        if change == "in place":
            p.grad.zero_()
        elif change == "replaced":
            p.grad = torch.zeros_like(p.grad)
        elif change == "none":
            p.grad = None
    engine.step()
    moved = [not torch.equal(a, p) for a, p in zip(before, engine.module.parameters())]
    return {"shown": shown, "unused_zeros": unused_zeros, "moved": moved,
            "none_after_step": all(p.grad is None for p in engine.module.parameters())}


@pytest.mark.parametrize("change", ["in place", "replaced", "none", "kept"])
def test_the_boundary_grad_is_shown_in_bf16_and_the_step_takes_it_as_left(change):
    got = run_ranks(_edited_step, 1, change)
    assert got["shown"] and got["unused_zeros"] and got["none_after_step"]
    # a first AdamW step without weight decay moves exactly the weights whose gradient is not zero: the trunk's and
    # head a's where the script kept `.grad`, none where it zeroed them
    assert got["moved"] == [change == "kept"] * 4 + [False] * 4


def _windows(rank: int, world: int, stage: int) -> list:
    """Three updates of two micro-steps each: head a in the first micro-step, head b in the second."""
    engine = _engine(stage, 2, weight_decay=0.1)
    g = torch.Generator().manual_seed(10 + rank)
    grads = []
    for _ in range(3):
        for head in ("a", "b"):
            x = torch.randn(2, 4, generator=g).to(engine.device, torch.bfloat16)
            engine.backward(engine(x, head).float().pow(2).mean())
            if stage == 0 and head == "b":  # the boundary: what the step will take
                grads.append([p.grad.clone() for p in engine.module.parameters()])
            engine.step()
    return [[p.detach().clone() for p in engine.module.parameters()], grads]


def test_later_windows_sum_over_the_shown_average_as_zeroed_buckets_do():
    (mine, grads), (theirs, _) = run_ranks(_windows, 2, 0), run_ranks(_windows, 2, 1)
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
    assert all(not g.any() for window in grads for g in window[-2:])  # the unused head: zeros in every window

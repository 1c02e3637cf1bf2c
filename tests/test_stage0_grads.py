"""Stage 0 leaves the rank-averaged gradient in `.grad` after backward and steps on `.grad` as the script left it."""

from __future__ import annotations

import pytest
import torch

from dist_harness import run_ranks

pytestmark = pytest.mark.slow  # 2 spawned ranks

# DeepSpeed 0.19.8 on CPU (gloo, 2 ranks), stage 0, SGD lr 0.5, the script's clip_grad_norm_(..., 0.05)
DS_NORMS = [0.72692, 0.47441, 0.32782, 0.37081]
DS_RANK0_LOSSES = [0.101248, 0.082422, 0.061249, 0.097832]
DS_WEIGHT_SUMS = [-0.45827, -0.09811, -0.93959, -0.1075]


def _manual_clip(rank: int, world: int) -> dict:
    from zero_core import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config={
        "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0}})
    g = torch.Generator().manual_seed(3 + rank)
    norms, losses, after_step = [], [], []
    for _ in range(4):
        loss = engine(torch.randn(2, 6, generator=g).to(engine.device)).pow(2).mean()
        engine.backward(loss)
        norms.append(float(torch.nn.utils.clip_grad_norm_(engine.module.parameters(), 0.05)))
        engine.step()
        losses.append(float(loss))
        after_step.append([p.grad is None for p in engine.module.parameters()])
    return {"norms": norms, "losses": losses, "after_step": after_step,
            "w": [float(p.detach().sum()) for p in engine.module.parameters()]}


def test_stage0_script_clipping_of_p_grad_reaches_the_step():
    got = run_ranks(_manual_clip, 2)
    assert got["norms"] == pytest.approx(DS_NORMS, abs=2e-5)
    assert got["losses"] == pytest.approx(DS_RANK0_LOSSES, abs=2e-6)
    assert got["w"] == pytest.approx(DS_WEIGHT_SUMS, abs=2e-5)
    assert all(all(step) for step in got["after_step"])  # None after the step, as DeepSpeed's zero_grad


def _engine_norms(rank: int, world: int, change: str) -> tuple[list[float], list[float]]:
    """The norm of `.grad` as the script leaves it, and the norm the engine's step took, over 3 steps."""
    from zero_core import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config={
        "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0, "zero_optimization": {"stage": 0}})
    g = torch.Generator().manual_seed(5)
    left, taken = [], []
    for _ in range(3):
        engine.backward(engine(torch.randn(2, 6, generator=g).to(engine.device)).pow(2).mean())
        for p in engine.module.parameters():
            if change == "in place":
                p.grad.mul_(4.0)
            elif change == "replaced":
                p.grad = p.grad * 4.0
        left.append(float(torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))))
        engine.step()
        taken.append(float(engine.optimizer.grad_norm))
    return left, taken


@pytest.mark.parametrize("change", ["in place", "replaced", "none"])
def test_the_configs_clipping_takes_the_norm_of_grad_as_the_script_left_it(change):
    left, taken = run_ranks(_engine_norms, 1, change)
    assert taken == pytest.approx(left, rel=1e-5)

"""`deepspeed.runtime.lr_schedules.LRRangeTest` built on the script's optimizer: DeepSpeed 0.19.8's lrs, alone
and passed to initialize as the engine's scheduler."""

from __future__ import annotations

import pytest
import torch

from zero_core import deepspeed
from zero_core.deepspeed.runtime.lr_schedules import LRRangeTest

# DeepSpeed 0.19.8's LRRangeTest on the groups of _optimizer() (lrs 0.5 and 0.25): each group's lr at construction
# and after each of 5 step() calls, for the arguments in ARGS
ARGS = {"continuous": {"lr_range_test_min_lr": 1e-3, "lr_range_test_step_size": 3, "lr_range_test_step_rate": 2.0},
        "staircase": {"lr_range_test_min_lr": [1e-3, 2e-3], "lr_range_test_step_size": 2,
                      "lr_range_test_step_rate": 0.5, "lr_range_test_staircase": True}}
DS_LRS = {
    "continuous": [[0.001, 0.001], [0.0016666666666666666, 0.0016666666666666666],
                   [0.002333333333333333, 0.002333333333333333], [0.003, 0.003],
                   [0.0036666666666666666, 0.0036666666666666666], [0.004333333333333334, 0.004333333333333334]],
    "staircase": [[0.001, 0.002], [0.001, 0.002], [0.0015, 0.003], [0.0015, 0.003], [0.002, 0.004],
                  [0.002, 0.004]],
}
# _train below on DeepSpeed 0.19.8 (CPU, one rank, stage 2): the losses and engine.get_lr() after each step
DS_LOSSES = [0.6375367641448975, 3.9235193729400635, 0.6240229606628418, 0.46196460723876953, 0.16075339913368225]
DS_ENGINE_LRS = [0.015, 0.02, 0.025, 0.03, 0.035]


def _optimizer() -> torch.optim.Optimizer:
    m = torch.nn.Linear(3, 2)
    return torch.optim.AdamW([{"params": [m.weight], "lr": 0.5}, {"params": [m.bias], "lr": 0.25}])


@pytest.mark.parametrize("case", sorted(ARGS))
def test_lr_range_test_writes_deepspeeds_lrs(case):
    opt = _optimizer()
    scheduler = LRRangeTest(opt, **ARGS[case])
    seen = [[g["lr"] for g in opt.param_groups]]
    for _ in range(5):
        scheduler.step()
        seen.append([g["lr"] for g in opt.param_groups])
    assert seen == DS_LRS[case]
    assert scheduler.get_last_lr() == seen[-1] and scheduler.state_dict() == {"last_batch_iteration": 4}


def test_lr_range_test_drives_the_engine_as_on_deepspeed():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}
    scheduler = LRRangeTest(opt, lr_range_test_min_lr=1e-2, lr_range_test_step_size=2)
    engine, _, _, handed = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=scheduler, config=cfg)
    assert handed is scheduler
    g = torch.Generator().manual_seed(1)
    losses, lrs = [], []
    for _ in range(5):
        x, y = torch.randn(2, 4, generator=g), torch.randn(2, 2, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        lrs.append(engine.get_lr()[0])
    assert losses == pytest.approx(DS_LOSSES, abs=1e-6) and lrs == pytest.approx(DS_ENGINE_LRS, rel=1e-12)
    engine.close()

"""A torch optimizer passed to initialize keeps the lrs its groups were given as Python floats, as DeepSpeed keeps
them (0.05, then 0.025 after a StepLR halves it), though the update reads them in float32."""

from __future__ import annotations

import pytest
import torch


def _train(with_schedule: bool) -> tuple[list[list[float]], list[float], torch.optim.Optimizer]:
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if with_schedule else None
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=schedule, config=cfg)
    g = torch.Generator().manual_seed(1)
    reported = []
    try:
        for _ in range(4):
            x, y = torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)
            engine.backward(torch.nn.functional.mse_loss(engine(x), y))
            engine.step()
            reported.append(engine.get_lr())
    finally:
        engine.close()
    return reported, [pg["lr"] for pg in opt.param_groups], opt


def test_constant_lr_stays_the_float_given():
    reported, groups, _ = _train(with_schedule=False)
    assert reported == [[0.05]] * 4 and groups == [0.05]  # exact: not 0.05000000074505806


def test_scheduled_lr_stays_the_float_the_scheduler_wrote():
    reported, groups, opt = _train(with_schedule=True)
    assert reported == [[0.05], [0.025], [0.025], [0.0125]] and groups == [0.0125]
    assert all(type(pg["lr"]) is float for pg in opt.param_groups)
    assert sorted({k for state in opt.state.values() for k in state}) == ["momentum_buffer"]


@pytest.mark.parametrize("lr", [0.05, 0.1, 1e-3])
def test_an_lr_the_loop_sets_is_kept_as_given(lr):
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt,
                                      config={"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0}})
    try:
        opt.param_groups[0]["lr"] = lr
        for _ in range(2):
            engine.backward(engine(torch.ones(2, 4)).sum())
            engine.step()
        assert opt.param_groups[0]["lr"] == lr and engine.get_lr() == [lr]
    finally:
        engine.close()

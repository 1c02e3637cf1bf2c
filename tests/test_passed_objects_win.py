"""An optimizer or lr scheduler passed to `deepspeed.initialize` beside the config's own section: the passed one
runs, as on DeepSpeed 0.19.8 (whose engine uses the client's objects whenever given), and rank 0 says which section
went unused. Each run equals the same script without that section, step for step."""

from __future__ import annotations

import torch

import zero_core.deepspeed as deepspeed

_BASE = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}
_SECTIONS = {"optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.1}},
             "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}


def _run(sections: tuple[str, ...], passed: tuple[str, ...]) -> tuple[list[list[float]], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01) if "optimizer" in passed else None
    made = "scheduler" in passed
    scheduler = (lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)) if made else None
    config = {**_BASE, **{k: _SECTIONS[k] for k in sections}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=optimizer,
                                      lr_scheduler=scheduler, config=config)
    lrs = [engine.get_lr()]
    torch.manual_seed(1)
    for _ in range(3):
        engine.backward(engine(torch.randn(2, 4)).square().mean())
        engine.step()
        lrs.append(engine.get_lr())
    weights = [p.detach().clone() for p in engine.module.parameters()]
    engine.close()
    return lrs, weights


def test_a_passed_optimizer_runs_instead_of_the_configs(capsys):
    lrs, weights = _run(("optimizer",), ("optimizer",))
    assert "passed an optimizer, which runs instead of the config's 'optimizer' section" in capsys.readouterr().out
    alone_lrs, alone = _run((), ("optimizer",))
    assert lrs == alone_lrs == [[0.01]] * 4 and all(torch.equal(a, b) for a, b in zip(weights, alone))


def test_a_passed_scheduler_runs_instead_of_the_configs_and_both_at_once(capsys):
    lrs, weights = _run(("optimizer", "scheduler"), ("optimizer", "scheduler"))
    out = capsys.readouterr().out
    assert "an optimizer and an lr_scheduler, which run instead of the config's 'optimizer' and 'scheduler'" in out
    alone_lrs, alone = _run((), ("optimizer", "scheduler"))
    assert lrs == alone_lrs and lrs[1] == [0.005] and all(torch.equal(a, b) for a, b in zip(weights, alone))
    lrs, _ = _run(("optimizer", "scheduler"), ("scheduler",))  # the config's optimizer under the passed schedule
    assert [round(lr[0], 6) for lr in lrs] == [0.05, 0.025, 0.0125, 0.00625]

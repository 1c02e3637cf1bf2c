"""The engine's optimizer and scheduler as DeepSpeed scripts drive them. A scheduler whose step() wants an argument
(torch's ReduceLROnPlateau), passed to deepspeed.initialize, is stepped with the global batch size as its metric
after each update, as DeepSpeed 0.19.8's engine does when the plain step() raises TypeError (its
`_take_model_step`), instead of failing."""

from __future__ import annotations

import torch
from parity_workers import ds_config, make_batches, make_model

from zero_core import deepspeed


def test_a_plateau_scheduler_is_stepped_with_the_batch_size_as_its_metric():
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1)
    cfg = {k: v for k, v in ds_config(1, "fp32", 2).items() if k != "optimizer"}
    engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=plateau, config=cfg)
    assert sched is plateau
    # the lrs the same scheduler gives when stepped with that metric after each update
    ref_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
    ref = torch.optim.lr_scheduler.ReduceLROnPlateau(ref_opt, factor=0.5, patience=1)
    lrs, expected = [], []
    for x, y in make_batches(6, 2):
        engine.backward(engine(x, y).loss)
        engine.step()
        ref.step(engine.train_batch_size())
        lrs.append(engine.get_lr()[0])
        expected.append(ref_opt.param_groups[0]["lr"])
    assert lrs == expected and lrs[-1] < lrs[0]  # the metric never improves: the lr halves after each patience


def test_the_engines_own_optimizer_answers_zero_grad_and_training_goes_on():
    """Scripts call `engine.optimizer.zero_grad()` after `engine.step()`, as DeepSpeed's ZeRO optimizers take it."""
    model = make_model()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config(2, "fp32", 2))
    before = [p.detach().clone() for p in engine.module.parameters()]
    for x, y in make_batches(2, 2):
        engine.backward(engine(x, y).loss)
        engine.step()
        engine.optimizer.zero_grad()
    assert any(not torch.equal(a, p) for a, p in zip(before, engine.module.parameters()))

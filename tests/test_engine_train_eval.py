"""`engine.eval()` / `engine.train()` switch the model's mode and leave `engine.training` as DeepSpeed's engine
leaves it."""

from __future__ import annotations

import pytest
import torch

import zero_core.deepspeed as deepspeed


def test_eval_and_train_switch_the_model_only():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    # DeepSpeed 0.19.8 on CPU: after eval() engine.training True, engine.module.training False; after train() both True
    engine.eval()
    assert (engine.training, engine.module.training, model[1].training) == (True, False, False)
    x = torch.ones(1, 4)
    assert torch.equal(engine(x), engine(x))  # dropout is off in the model
    engine.train()
    assert (engine.training, engine.module.training, model[1].training) == (True, True, True)
    engine.train(False)
    assert (engine.training, engine.module.training) == (True, False)
    with pytest.raises(ValueError, match="takes True or False"):
        engine.train("no")

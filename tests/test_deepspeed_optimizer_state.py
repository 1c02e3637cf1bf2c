"""`optimizer.state` (and `engine.optimizer.state`, the same object as on DeepSpeed) after `initialize`: empty
before the first update, then per parameter of the groups `step`, `exp_avg`, `exp_avg_sq` with the engine's
values, at every stage, for the config's optimizer and for a torch optimizer passed in."""

from __future__ import annotations

import pytest
import torch

import zero_core.deepspeed as deepspeed

# DeepSpeed 0.19.8 on CPU (torch_adam), this model, groups and batches, after 3 steps: the abs-sums of each
# group's exp_avg and exp_avg_sq (its flat fp32 partition at ZeRO stages; the sum over its parameters at stage 0),
# and of an SGD's momentum_buffer; every state's step is 3.0
DS_EXP_AVG = [0.672159, 0.659581]
DS_EXP_AVG_SQ = [0.000724, 0.001725]
DS_MOMENTUM = [6.940489, 6.734262]


def _initialize(stage: int, kind: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    groups = [{"params": [model[0].weight, model[0].bias]},
              {"params": [model[2].weight, model[2].bias], "weight_decay": 0.0}]
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
           "zero_allow_untested_optimizer": True}
    opt = None
    if kind == "config":
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}
    elif kind == "adamw":
        opt = torch.optim.AdamW(groups, lr=0.01, weight_decay=0.1)
    else:
        opt = torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    engine, optimizer, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg,
                                                 model_parameters=groups if opt is None else None)
    return engine, optimizer


def _train(engine, steps: int) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()


def _group_sums(optimizer, name: str) -> list[float]:
    return [sum(float(optimizer.state[p][name].abs().sum()) for p in g["params"]) for g in optimizer.param_groups]


@pytest.mark.parametrize("kind", ["config", "adamw"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_adam_state_answers_as_deepspeeds(stage, kind):
    engine, optimizer = _initialize(stage, kind)
    assert engine.optimizer.state is optimizer.state  # one object, as DeepSpeed's engine.optimizer is the one returned
    assert len(optimizer.state) == 0  # torch's and DeepSpeed's states are made at the first update
    _train(engine, 3)
    state = engine.optimizer.state
    assert len(state) == sum(len(g["params"]) for g in optimizer.param_groups) > 0
    assert all(p in state for g in optimizer.param_groups for p in g["params"])
    for values in state.values():
        assert sorted(values) == ["exp_avg", "exp_avg_sq", "step"] and float(values["step"]) == 3.0
        assert values["exp_avg"].dtype == torch.float32 and values["step"].shape == ()
    assert _group_sums(optimizer, "exp_avg") == pytest.approx(DS_EXP_AVG, abs=2e-6)
    assert _group_sums(optimizer, "exp_avg_sq") == pytest.approx(DS_EXP_AVG_SQ, abs=2e-6)
    with pytest.raises(KeyError, match="has no optimizer state"):
        state[torch.zeros(2)]


def test_in_place_edits_reach_the_states():
    engine, optimizer = _initialize(2, "config")
    _train(engine, 1)
    first = optimizer.param_groups[0]["params"][0]
    optimizer.state[first]["exp_avg"].zero_()  # the moments are views of the states where they are in memory
    assert float(optimizer.state[first]["exp_avg"].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="cannot be replaced"):
        optimizer.state = {}


@pytest.mark.parametrize("stage", [0, 1])
def test_a_torch_sgd_keeps_its_own_state_on_the_partition(stage):
    engine, optimizer = _initialize(stage, "sgd")
    _train(engine, 3)
    assert engine.optimizer.state is optimizer.state and len(optimizer.state) > 0
    assert _group_sums(optimizer, "momentum_buffer") == pytest.approx(DS_MOMENTUM, abs=2e-6)

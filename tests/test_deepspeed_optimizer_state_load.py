"""`load_state_dict()` on a torch optimizer passed to `initialize` (or on `engine.optimizer`, the same optimizer on
DeepSpeed): what it loads is what the engine's next update starts from, and `optimizer.state` stays the engine's
live states afterwards. A dict zero_core's one Adam step count cannot take is refused in one line, changing
nothing."""

from __future__ import annotations

import copy

import pytest
import torch

import zero_core.deepspeed as deepspeed

# DeepSpeed 0.19.8 on CPU (stages 0 and 2 alike), a torch AdamW passed in, this model, groups and batches: 2 steps,
# then a load of the optimizer's own state_dict with exp_avg halved and exp_avg_sq doubled, then 2 steps: their
# losses, each group's abs-sums of exp_avg and exp_avg_sq, and every state's step
DS_LOSSES = [0.364706, 1.279281]
DS_EXP_AVG = [0.881138, 0.658912]
DS_EXP_AVG_SQ = [0.001757, 0.003685]
DS_STEP = 4.0


def _initialize(stage: int, kind: str = "adamw", **zero):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    groups = [{"params": [model[0].weight, model[0].bias]},
              {"params": [model[2].weight, model[2].bias], "weight_decay": 0.0}]
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage, **zero},
           "zero_allow_untested_optimizer": True}
    if kind == "adamw":
        opt = torch.optim.AdamW(groups, lr=0.01, weight_decay=0.1)
    else:
        opt = torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    engine, optimizer, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    assert optimizer is opt
    return engine, optimizer


def _trainer(engine):
    g = torch.Generator().manual_seed(1)

    def train(steps: int) -> list[float]:
        losses = []
        for _ in range(steps):
            x, y = torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        return losses

    return train


def _scaled(optimizer, **factors: float) -> dict:
    sd = copy.deepcopy(optimizer.state_dict())
    for state in sd["state"].values():
        for name, factor in factors.items():
            state[name].mul_(factor)
    return sd


def _group_sums(optimizer, name: str) -> list[float]:
    return [sum(float(optimizer.state[p][name].abs().sum()) for p in g["params"]) for g in optimizer.param_groups]


@pytest.mark.parametrize("stage, device", [(0, None), (1, None), (2, None), (3, None), (2, "cpu"), (2, "nvme")],
                         ids=["0", "1", "2", "3", "2-cpu", "2-nvme"])
@pytest.mark.parametrize("through", ["optimizer", "engine.optimizer"])
def test_a_load_goes_into_the_engines_states_as_on_deepspeed(stage, device, through, tmp_path):
    offload = {"device": device, **({"nvme_path": str(tmp_path)} if device == "nvme" else {})}
    engine, optimizer = _initialize(stage, **({"offload_optimizer": offload} if device else {}))
    train = _trainer(engine)
    train(2)
    sd = _scaled(optimizer, exp_avg=0.5, exp_avg_sq=2.0)
    (optimizer if through == "optimizer" else engine.optimizer).load_state_dict(sd)
    assert optimizer.state is engine.optimizer.state  # still the engine's live states
    first = optimizer.param_groups[0]["params"][0]
    assert torch.equal(optimizer.state[first]["exp_avg"].reshape(-1), sd["state"][0]["exp_avg"].reshape(-1))
    assert train(2) == pytest.approx(DS_LOSSES, abs=2e-6)
    assert _group_sums(optimizer, "exp_avg") == pytest.approx(DS_EXP_AVG, abs=2e-6)
    assert _group_sums(optimizer, "exp_avg_sq") == pytest.approx(DS_EXP_AVG_SQ, abs=2e-6)
    assert {float(s["step"]) for s in optimizer.state.values()} == {DS_STEP}


def _refused(optimizer, sd) -> str:
    with pytest.raises(ValueError) as info:
        optimizer.load_state_dict(sd)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("optimizer.load_state_dict: ")
    return msg


def test_states_of_another_step_are_refused_changing_nothing():
    engine, optimizer = _initialize(2)
    train = _trainer(engine)
    train(1)
    sd = _scaled(optimizer, exp_avg=0.5)
    train(1)
    before = copy.deepcopy(optimizer.state_dict())
    lrs = [g["lr"] for g in optimizer.param_groups]
    sd["param_groups"][0]["lr"] = 0.5
    msg = _refused(optimizer, sd)
    assert "the saved states are at step 1 and this engine's at step 2" in msg
    assert "engine.load_checkpoint(dir)" in msg
    assert optimizer.state is engine.optimizer.state and [g["lr"] for g in optimizer.param_groups] == lrs
    after = optimizer.state_dict()
    for key, state in before["state"].items():
        assert all(torch.equal(state[n], after["state"][key][n]) for n in ("exp_avg", "exp_avg_sq"))


def test_states_that_are_not_this_ranks_share_are_refused():
    engine, optimizer = _initialize(1)
    _trainer(engine)(1)
    sd = copy.deepcopy(optimizer.state_dict())
    sd["state"][0]["exp_avg"] = torch.zeros(3)
    assert "exp_avg of parameter 0 must be a floating tensor of this rank's 128 elements of it, got 3 elements" in \
        _refused(optimizer, sd)
    sd = copy.deepcopy(optimizer.state_dict())
    sd["state"][0]["max_exp_avg_sq"] = torch.zeros(128)
    assert "must hold step, exp_avg and exp_avg_sq" in _refused(optimizer, sd)
    del sd["state"][0]
    assert "it holds the states of 3 of the 4 trained parameters" in _refused(optimizer, sd)


def test_a_torch_sgd_loads_through_engine_optimizer_as_through_itself():
    engine, optimizer = _initialize(1, "sgd")
    _trainer(engine)(2)
    sd = _scaled(optimizer, momentum_buffer=0.5)
    engine.optimizer.load_state_dict(sd)  # DeepSpeed's engine.optimizer is the optimizer it handed back
    assert engine.optimizer.state is optimizer.state
    assert engine.optimizer.state_dict()["state"][0]["momentum_buffer"].equal(sd["state"][0]["momentum_buffer"])

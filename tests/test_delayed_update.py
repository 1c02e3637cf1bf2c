"""zero_core.offload_delayed_update (the ZeRO-Offload paper's one-step delayed update): opt-in, strictly
validated, converges on a tiny model like the exact update but is not equal to it."""

from __future__ import annotations

import pytest
import torch
from parity_workers import ds_config, make_batches, make_model

import zero_core
from zero_core import ConfigError, load_config
from zero_core.optim.delayed_update import DelayedHostAdamW

STEPS = 25


def _losses(delayed: bool, gas: int = 1) -> tuple[list[float], dict[str, torch.Tensor], object]:
    cfg = ds_config(2, "fp32", 2, gas=gas, clip=1.0, offload_optimizer={"device": "cpu"})
    cfg["optimizer"]["params"]["lr"] = 1e-2
    cfg["zero_core"] = {"offload_delayed_update": delayed}
    engine = zero_core.initialize(make_model(), cfg)
    batches = make_batches(4, 2)  # a few batches seen again and again: the loss must fall
    losses = []
    for i in range(STEPS * gas):
        x, y = batches[i % len(batches)]
        loss = engine(x, y).loss
        losses.append(float(loss.detach()))
        engine.backward(loss)
        engine.step()
    state = engine.full_state_dict()  # applies the update still running
    kind = type(engine.optimizer)
    engine.close()
    return losses, state, kind


@pytest.mark.parametrize("gas", [1, 2])
def test_delayed_update_converges_but_changes_the_numerics(gas):
    exact, exact_state, exact_kind = _losses(False, gas)
    delayed, delayed_state, delayed_kind = _losses(True, gas)
    assert delayed_kind is DelayedHostAdamW and exact_kind is not DelayedHostAdamW
    assert delayed[:gas] == exact[:gas]  # the first step runs on the initial weights in both
    assert delayed[gas : 2 * gas] != exact[gas : 2 * gas]  # the second: update 1 still runs on the host
    assert delayed != exact  # from then on each forward sees weights one update older
    first, last = sum(delayed[: 5 * gas]) / (5 * gas), sum(delayed[-5 * gas :]) / (5 * gas)
    assert last < 0.85 * first  # it trains
    exact_last = sum(exact[-5 * gas :]) / (5 * gas)
    assert abs(last - exact_last) < 0.2 * first  # near where the exact update gets (it lags a step)
    assert any(not torch.equal(delayed_state[k], v) for k, v in exact_state.items())


def test_checkpoint_of_a_delayed_run_holds_every_computed_update(tmp_path):
    cfg = ds_config(2, "fp32", 2, offload_optimizer={"device": "cpu"})
    cfg["zero_core"] = {"offload_delayed_update": True}
    engine = zero_core.initialize(make_model(), cfg)
    for x, y in make_batches(3, 2):
        engine.backward(engine(x, y).loss)
        engine.step()
    assert engine.optimizer.pending  # the third update still runs on the host
    engine.save_checkpoint(tmp_path)
    assert not engine.optimizer.pending
    saved = engine.full_state_dict()
    engine.close()
    other = zero_core.initialize(make_model(), ds_config(2, "fp32", 2, offload_optimizer={"device": "cpu"}))
    other.load_checkpoint(tmp_path)
    assert other.global_step == 3
    for k, v in other.full_state_dict().items():
        assert torch.equal(v, saved[k]), k
    for name, p in other.module.named_parameters():  # the working weights are the loaded masters
        assert torch.equal(p.detach(), saved[name]), name
    other.close()


@pytest.mark.parametrize(
    "zero, core, expected",
    [
        ({"stage": 2}, {"offload_delayed_update": True}, "offload_optimizer is off"),
        (
            {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}},
            {"offload_delayed_update": True},
            "cannot be combined with partial offload",
        ),
        (
            {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            {"offload_delayed_update": True, "overlap_host_update": 0.5},
            "both move the host update",
        ),
        (
            {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            {"offload_delayed_update": "maybe"},
            "must be true or false",
        ),
        ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, {"offload_delayed_update": True}, None),
    ],
)
def test_delayed_update_is_strictly_validated(zero, core, expected):
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero, "zero_core": core}
    if expected is None:
        assert load_config(cfg, 1).zero_core.offload_delayed_update is True
        return
    with pytest.raises(ConfigError) as e:
        load_config(cfg, 1)
    assert expected in str(e.value) and "zero_core.offload_delayed_update" in str(e.value) and "\n" not in str(e.value)

"""A loop that writes weight_decay, eps or betas into the optimizer's groups changes the next update, as under
DeepSpeed (a weight-decay schedule written into `engine.optimizer.param_groups` every step, DINO's way)."""

from __future__ import annotations

import pytest
import torch

# DeepSpeed 0.19.8 on CPU (one rank, "torch_adam"), the loop of _losses below:
DS_LOSSES = {
    # torch.optim.AdamW(lr=0.01, weight_decay=0) passed as optimizer=, stage 0, weight_decay 0.2 * (i + 1) each step
    "schedule": [0.4568275213241577, 1.5818657875061035, 0.36469724774360657, 1.2682924270629883,
                 0.8748748302459717, 0.7735997438430786],
    # the config's AdamW (lr 0.01, weight_decay 0), stage 2, the same weight-decay schedule
    "config": [0.4568275213241577, 1.5818657875061035, 0.36469724774360657, 1.2682924270629883,
               0.8748748302459717, 0.7735996842384338],
    # torch.optim.Adam(lr=0.01, weight_decay=0.01) (L2), stage 1, eps 1e-2 and betas (0.5, 0.9) from step 2 on
    "eps_betas": [0.4568275213241577, 1.5863860845565796, 0.3647803068161011, 1.285388708114624,
                  0.8818765878677368, 0.7964218854904175],
}
STAGE = {"schedule": 0, "config": 2, "eps_betas": 1}


def _engine(case: str, offload: bool = False):
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": STAGE[case]}}
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if case == "config":
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0, "torch_adam": True}}
        return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]
    made = torch.optim.AdamW if case == "schedule" else torch.optim.Adam
    opt = made(model.parameters(), lr=0.01, weight_decay=0.0 if case == "schedule" else 0.01)
    return deepspeed.initialize(model=model, optimizer=opt, config=cfg)[0]


def _losses(case: str, offload: bool = False) -> list[float]:
    engine = _engine(case, offload)
    g = torch.Generator().manual_seed(1)
    losses = []
    try:
        for i in range(6):
            for group in engine.optimizer.param_groups:
                if case != "eps_betas":
                    group["weight_decay"] = 0.2 * (i + 1)
                elif i == 2:
                    group["eps"], group["betas"] = 1e-2, (0.5, 0.9)
            x, y = torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    finally:
        engine.close()
    return losses


@pytest.mark.parametrize("case", sorted(DS_LOSSES))
def test_values_written_into_the_groups_drive_the_next_update_as_in_deepspeed(case):
    assert _losses(case) == pytest.approx(DS_LOSSES[case], abs=1e-6)


def test_the_host_update_of_optimizer_offload_takes_them_too():
    assert _losses("config", offload=True) == pytest.approx(DS_LOSSES["config"], abs=1e-6)


@pytest.mark.parametrize("key, value, words", [("weight_decay", "0.1", "['weight_decay'] is '0.1'"),
                                               ("eps", float("nan"), "['eps'] is nan"),
                                               ("betas", (0.9, 1.5), "['betas'] is (0.9, 1.5)")])
def test_a_value_that_is_no_number_in_range_is_one_line(key, value, words):
    engine = _engine("config")
    try:
        engine.optimizer.param_groups[0][key] = value
        engine.backward(engine(torch.ones(2, 8)).sum())
        with pytest.raises(ValueError, match="param_groups") as caught:
            engine.step()
        assert words in str(caught.value) and "\n" not in str(caught.value)
    finally:
        engine.close()

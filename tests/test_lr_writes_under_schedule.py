"""Under the config's scheduler, an lr (or OneCycle's betas) the loop writes into the optimizer's groups between
steps is taken by the next update alone and reported by `engine.get_lr()`, as in DeepSpeed; the scheduler's next
step writes its own again and `scheduler.get_last_lr()` keeps reporting the schedule's."""

from __future__ import annotations

import pytest
import torch
from schedule_cases import scheduled_config, small_model

# DeepSpeed 0.19.8 on CPU (one rank, fp32, "torch_adam"), the loop of _run below: the losses, and get_lr()[0] and
# scheduler.get_last_lr()[0] after each step. The same with ZeRO-1 and with ZeRO-2 and optimizer offload.
DEEPSPEED = {
    "WarmupDecayLR": {
        "losses": [0.4568275213241577, 1.5773290395736694, 0.36606693267822266, 1.3752682209014893,
                   0.9311301708221436, 0.7390486598014832, 1.0699468851089478],
        "lrs": [0.0, 0.0063092975357145736, 0.1, 0.01, 0.009411764705882354, 0.008823529411764706,
                0.00823529411764706],
        "last": [0.0, 0.0063092975357145736, 0.01, 0.01, 0.009411764705882354, 0.008823529411764706,
                 0.00823529411764706],
    },
    "OneCycle": {
        "losses": [0.4568275213241577, 1.5778688192367554, 0.36372363567352295, 1.3431731462478638,
                   1.0227364301681519, 0.7274074554443359, 1.323515772819519],
        "lrs": [0.003999999999999999, 0.006999999999999998, 0.1, 0.007750000000000002, 0.005499999999999999,
                0.0032499999999999994, 0.001],
        "last": [0.003999999999999999, 0.006999999999999998, 0.010000000000000002, 0.007750000000000002,
                 0.005499999999999999, 0.0032499999999999994, 0.001],
    },
}
def _run(schedule: str, stage: int, offload: bool, overlap: float = 0.0) -> dict[str, list[float]]:
    """7 steps; after step 2 the loop writes lr 0.1 (and, under OneCycle, betas (0.5, 0.9)); between the backward
    and the step of step 4 it writes lr 0.03."""
    import zero_core.deepspeed as deepspeed

    model, cfg = small_model(), scheduled_config(schedule, stage, offload)
    if overlap:
        cfg["zero_core"] = {"overlap_host_update": overlap}  # host updates started during backward
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                           config=cfg)
    g = torch.Generator().manual_seed(1)
    seen: dict[str, list[float]] = {"losses": [], "lrs": [], "last": []}
    try:
        for i in range(7):
            x, y = torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            if i == 4:
                for group in optimizer.param_groups:
                    group["lr"] = 0.03
            engine.step()
            if i == 2:
                for group in optimizer.param_groups:
                    group["lr"] = 0.1
                    if schedule == "OneCycle":
                        group["betas"] = (0.5, 0.9)
            seen["losses"].append(loss.item())
            seen["lrs"].append(engine.get_lr()[0])
            seen["last"].append(scheduler.get_last_lr()[0])
    finally:
        engine.close()
    return seen


def _check(seen: dict[str, list[float]], schedule: str) -> None:
    want = DEEPSPEED[schedule]
    assert seen["lrs"] == pytest.approx(want["lrs"], rel=1e-12)
    assert seen["last"] == pytest.approx(want["last"], rel=1e-12)
    assert seen["losses"] == pytest.approx(want["losses"], abs=1e-6)


@pytest.mark.parametrize("schedule", sorted(DEEPSPEED))
@pytest.mark.parametrize("stage, offload", [(1, False), (2, True)])
def test_an_lr_written_under_a_schedule_drives_the_next_update_as_in_deepspeed(schedule, stage, offload):
    _check(_run(schedule, stage, offload), schedule)


def test_a_host_update_started_during_backward_is_redone_with_the_written_lr():
    _check(_run("WarmupDecayLR", 2, True, overlap=1.0), "WarmupDecayLR")


def test_a_bad_lr_written_under_a_schedule_is_one_line():
    import zero_core.deepspeed as deepspeed

    model = torch.nn.Linear(8, 4)
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01}},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    try:
        optimizer.param_groups[0]["lr"] = float("nan")
        engine.backward(engine(torch.ones(2, 8)).sum())
        with pytest.raises(ValueError, match=r"param_groups\[0\]\['lr'\] is nan") as caught:
            engine.step()
        assert "\n" not in str(caught.value)
    finally:
        engine.close()

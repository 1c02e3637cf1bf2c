"""OneCycle with cycle_momentum writes every group's betas as (momentum, 0.99), as DeepSpeed's does: the updates run
with beta2 0.99 and optimizer.param_groups / engine.get_mom() report it, from the config's `scheduler` section and
from the class a script builds; without cycle_momentum (or before a resumed schedule's first step) the optimizer's
own betas hold."""

from __future__ import annotations

import warnings

import pytest
import torch

from zero_core import deepspeed
from zero_core.deepspeed.runtime import lr_schedules

ONECYCLE = {"cycle_min_lr": 0.01, "cycle_max_lr": 0.05, "cycle_first_step_size": 3, "cycle_min_mom": 0.85,
            "cycle_max_mom": 0.95}
CASES = {"cycle": ONECYCLE, "no_cycle": {**ONECYCLE, "cycle_momentum": False},
         "resumed": {**ONECYCLE, "last_batch_iteration": 2}}
STEPS = 8

# From DeepSpeed 0.19.8 on the CPU (one gloo process, ZeRO stage 2, fp32, the config's AdamW lr 0.01, betas
# (0.9, 0.999), eps 1e-8, weight_decay 0.01, torch_adam; gradient_clipping 0) training _model() on _batches() under
# the config's OneCycle(CASES[case]): each step's loss, and the betas get_mom() and optimizer.param_groups reported
# before it. OneCycle built by the script on a torch AdamW, and the config's on a client AdamW, trained the same.
# LOOP_WRITES: no scheduler, the loop writing lr 0.02 and betas (0.8, 0.95) into every group before each step.
# NADAM: the config's OneCycle(ONECYCLE) on a client NAdam (the AdamW's hyper-parameters), its betas cycled the same.
DS_LOSSES = {
    "cycle": [0.9913050532341003, 0.3688044548034668, 0.5115126967430115, 0.7461733818054199, 0.6394973397254944,
              0.7043213844299316, 0.5950679183006287, 1.05548894405365],
    "no_cycle": [0.9913050532341003, 0.3688044548034668, 0.5380592346191406, 0.8428972363471985, 0.6887319684028625,
                 0.7568036913871765, 0.5894424915313721, 0.672018826007843],
    "resumed": [0.9913050532341003, 0.3688044548034668, 0.46982860565185547, 0.6693654656410217, 0.8079140186309814,
                1.0051268339157104, 0.7378063201904297, 0.3307485282421112],
}
LOOP_WRITES = [0.9913050532341003, 0.36030113697052, 0.5223314166069031, 0.8696755766868591, 0.770612895488739,
               0.7461708188056946, 0.6618543267250061, 0.5614942908287048]
NADAM = [0.9913050532341003, 0.3680074214935303, 0.5706009268760681, 0.9893642067909241, 0.5125336050987244,
         0.5235907435417175, 0.5249844789505005, 0.9833810925483704]
_UP, _DOWN = 0.9166666666666666, 0.8833333333333333
DS_BETAS = {
    "cycle": [(m, 0.99) for m in (0.85, _UP, _DOWN, 0.85, _DOWN, _UP, 0.95, 0.95)],
    "no_cycle": [(0.9, 0.999)] * STEPS,
    "resumed": [(0.9, 0.999)] + [(m, 0.99) for m in (_DOWN, _UP, 0.95, 0.95, 0.95, 0.95, 0.95)],
}


def _model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with torch.no_grad():  # fixed weights, the same in both frameworks
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.sin(torch.arange(p.numel(), dtype=torch.float64) * 0.37 + i).reshape(p.shape) * 0.5)
    return model


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    x = torch.cos(torch.arange(STEPS * 16, dtype=torch.float64) * 0.11).reshape(STEPS, 4, 4).float()
    y = torch.sin(torch.arange(STEPS * 12, dtype=torch.float64) * 0.23).reshape(STEPS, 4, 3).float()
    return list(zip(x, y))


def _train(params: dict, source: str) -> tuple[list[float], list, list]:
    """(losses, get_mom(), the returned optimizer's betas) of each step. `source`: "config" (the config's AdamW and
    OneCycle), "client" (the config's OneCycle on the script's AdamW; "nadam": NAdam) or "script" (both the
    script's)."""
    model = _model()
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0, "zero_optimization": {"stage": 2}}
    adamw = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    opt = torch.optim.AdamW(model.parameters(), **adamw) if source != "config" else None
    if source == "nadam":  # a client optimizer zero_core runs as it is, on its own groups
        opt, cfg["zero_allow_untested_optimizer"] = torch.optim.NAdam(model.parameters(), **adamw), True
    if source == "config":
        cfg["optimizer"] = {"type": "AdamW", "params": {**adamw, "betas": list(adamw["betas"])}}
    if source != "script":
        cfg["scheduler"] = {"type": "OneCycle", "params": params}
    scheduler = lr_schedules.OneCycle(opt, **params) if source == "script" else None
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=opt,
                                                   lr_scheduler=scheduler, config=cfg)
    losses, moms, groups = [], [], []
    for x, y in _batches():
        moms.append([tuple(m) for m in engine.get_mom()])
        groups.append([tuple(g["betas"]) for g in optimizer.param_groups])
        loss = ((engine(x.to(engine.device)) - y.to(engine.device)) ** 2).mean()
        losses.append(loss.item())
        engine.backward(loss)
        engine.step()
    engine.close()
    return losses, moms, groups


@pytest.mark.parametrize("case, source", [("cycle", "config"), ("no_cycle", "config"), ("resumed", "config"),
                                          ("cycle", "client"), ("cycle", "script"), ("resumed", "script")])
def test_onecycle_trains_with_deepspeeds_betas(case, source):
    losses, moms, groups = _train(CASES[case], source)
    assert moms == groups == [[betas] for betas in DS_BETAS[case]]
    assert losses == pytest.approx(DS_LOSSES[case], rel=1e-6, abs=0)  # beta2 0.999 moves step 3's loss by 5%


def test_a_client_optimizer_with_betas_has_them_cycled_as_deepspeeds_is():
    losses, moms, groups = _train(ONECYCLE, "nadam")
    assert moms == groups == [[betas] for betas in DS_BETAS["cycle"]]
    assert losses == pytest.approx(NADAM, rel=1e-6, abs=0)


def test_a_loop_writing_betas_into_the_groups_gets_both_as_deepspeeds_optimizer_does():
    model = _model()
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0, "zero_optimization": {"stage": 2},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.999], "weight_decay": 0.01}}}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    losses = []
    for x, y in _batches():
        for group in optimizer.param_groups:
            group["lr"], group["betas"] = 0.02, (0.8, 0.95)
        loss = ((engine(x.to(engine.device)) - y.to(engine.device)) ** 2).mean()
        losses.append(loss.item())
        engine.backward(loss)
        engine.step()
    assert engine.get_mom() == [(0.8, 0.95)]
    engine.close()
    assert losses == pytest.approx(LOOP_WRITES, rel=1e-6, abs=0)


def test_the_class_writes_deepspeeds_betas_and_leaves_sgds_momentum_alone():
    params = [torch.nn.Parameter(torch.zeros(2))]
    adamw = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999))
    scheduler = lr_schedules.OneCycle(adamw, **ONECYCLE)
    seen = []
    for _ in range(STEPS):
        seen.append(adamw.param_groups[0]["betas"])
        scheduler.step()
    assert seen == DS_BETAS["cycle"]
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.7)
    with pytest.warns(UserWarning, match="SGD has no betas, so its momentum is not cycled"):
        scheduler = lr_schedules.OneCycle(sgd, **ONECYCLE)
    scheduler.step()
    assert sgd.param_groups[0]["momentum"] == 0.7 and "betas" not in sgd.param_groups[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lr_schedules.OneCycle(sgd, **CASES["no_cycle"])

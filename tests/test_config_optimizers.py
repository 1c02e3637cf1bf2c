"""Optimizers other than Adam/AdamW named by the config's `optimizer` section, and its LRRangeTest `scheduler`: they
train as DeepSpeed 0.19.8 trains them (tests/fixtures/deepspeed_config_optimizers/, made on the CPU by
tests/fixtures/make_config_optimizer_fixtures.py from tests/config_optimizer_script.py), Lion follows DeepSpeed's
update rule, and what zero_core cannot run is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import config_optimizer_script as script
from config_helpers import MB, error
from dist_harness import run_ranks
from test_deepspeed_lr_range_test import ARGS as RANGE_ARGS
from test_deepspeed_lr_range_test import DS_LRS as RANGE_DS_LRS
from zero_core import ConfigError, load_config
from zero_core.config_optimizer_models import OptimizerConfig
from zero_core.optim.lion import Lion

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "deepspeed_config_optimizers" / "reference.json")
                     .read_text())
REFERENCE = FIXTURE["cases"]


def _run(rank: int, world: int, name: str) -> dict:
    import zero_core.deepspeed as deepspeed

    return script.run(deepspeed, rank, world, name)


def _assert_as_deepspeed(got: dict, want: dict) -> None:
    assert got["losses"] == pytest.approx(want["losses"], abs=1e-6)
    flat = [[lr for lrs in run["lrs"] for lr in lrs] for run in (got, want)]
    assert flat[0] == pytest.approx(flat[1], rel=1e-12)
    for key, values in want["weights"].items():
        assert got["weights"][key] == pytest.approx(values, abs=1e-6), key


@pytest.mark.parametrize("name", [n for n, case in script.CASES.items() if case[2] == 1])
def test_a_config_optimizer_trains_as_deepspeed(name):
    _assert_as_deepspeed(_run(0, 1, name), REFERENCE[name])


def test_a_config_sgd_trains_as_deepspeed_on_two_ranks():
    name = "sgd_momentum_stage2_world2"
    _assert_as_deepspeed(run_ranks(_run, 2, name), REFERENCE[name])


@pytest.mark.parametrize("case", sorted(RANGE_ARGS))
def test_the_config_lr_range_test_gives_deepspeeds_lrs(case):
    """DeepSpeed's LRRangeTest on groups of lrs 0.5 and 0.25: each group's lr before the first update and after each
    of 5 (test_deepspeed_lr_range_test.py has DeepSpeed's numbers)."""
    import zero_core.deepspeed as deepspeed

    model = torch.nn.Linear(3, 2)
    groups = [{"params": [model.weight], "lr": 0.5}, {"params": [model.bias], "lr": 0.25}]
    cfg = {**MB, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
           "scheduler": {"type": "LRRangeTest", "params": RANGE_ARGS[case]}}
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    seen = [engine.get_lr()]
    for _ in range(5):
        engine.backward(engine(torch.ones(4, 3)).pow(2).mean())
        engine.step()
        seen.append(engine.get_lr())
    assert seen == RANGE_DS_LRS[case]
    assert [g["lr"] for g in optimizer.param_groups] == seen[-1] and scheduler.state_dict() == {
        "last_batch_iteration": 4}
    engine.close()


def test_lion_follows_deepspeeds_rule_element_by_element():
    lr, beta1, beta2, decay = 0.1, 0.9, 0.99, 0.5
    # element 3: the sign of c differs from that of the new momentum (c takes beta1, the momentum beta2)
    start, grads = [1.0, -2.0, 0.5, 3.0], [[0.2, -0.4, 0.0, 1.0], [-0.5, -0.1, 0.0, -0.2]]
    p = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    opt = Lion([p], lr=lr, betas=(beta1, beta2), weight_decay=decay)
    weights, momenta = list(start), [0.0] * 4
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        for i, gi in enumerate(g):  # c = b1 m + (1 - b1) g; p = p (1 - lr wd) - lr sign(c); m = b2 m + (1 - b2) g
            c = beta1 * momenta[i] + (1 - beta1) * gi
            weights[i] = weights[i] * (1 - lr * decay) - lr * ((c > 0) - (c < 0))
            momenta[i] = beta2 * momenta[i] + (1 - beta2) * gi
        assert p.detach().tolist() == pytest.approx(weights, abs=1e-15)
        assert opt.state[p]["exp_avg"].tolist() == pytest.approx(momenta, abs=1e-15)
    assert p[2].item() == pytest.approx(0.5 * (1 - lr * decay) ** 2)  # no gradient, no momentum: decay alone
    assert Lion([torch.nn.Parameter(torch.zeros(1))]).defaults == {"lr": 1e-3, "betas": (0.9, 0.999),
                                                                  "weight_decay": 0.0}  # DeepSpeed's


def test_lion_steps_as_deepspeeds_cpu_lion():
    """DeepSpeedCPULion's weights and momenta after each step (the fixture; DeepSpeed's FusedLion, the same rule,
    does not run on the CPU), within an fp32 ulp or so: DeepSpeed's kernel fuses some of the products."""
    want = FIXTURE["lion_cpu"]
    p = torch.nn.Parameter(torch.tensor(want["start"]))
    opt = Lion([p], **want["arguments"])
    for grad, weights, momenta in zip(want["grads"], want["weights"], want["exp_avg"], strict=True):
        p.grad = torch.tensor(grad)
        opt.step()
        assert p.detach().tolist() == pytest.approx(weights, abs=1e-6)
        assert opt.state[p]["exp_avg"].tolist() == pytest.approx(momenta, abs=1e-7)


def _lion_losses(model: torch.nn.Module, step) -> list[float]:
    g = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(4):
        loss = torch.nn.functional.mse_loss(model(torch.randn(4, 6, generator=g)), torch.randn(4, 3, generator=g))
        losses.append(loss.item())
        step(loss)
    return losses


@pytest.mark.parametrize("stage", [1, 2])
def test_a_config_lion_trains_as_lion_on_the_whole_model(stage):
    import zero_core.deepspeed as deepspeed

    params = {"lr": 0.01, "betas": [0.9, 0.95], "weight_decay": 0.1}
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    wrapped = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    wrapped.load_state_dict(plain.state_dict())
    opt = Lion(plain.parameters(), **params)

    def plain_step(loss):
        opt.zero_grad()
        loss.backward()
        opt.step()

    cfg = {**MB, "gradient_clipping": 0.0, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "Lion", "params": params}}
    engine, optimizer, *_ = deepspeed.initialize(model=wrapped, model_parameters=wrapped.parameters(), config=cfg)
    assert isinstance(optimizer, Lion)
    got = _lion_losses(engine, lambda loss: (engine.backward(loss), engine.step()))
    assert got == pytest.approx(_lion_losses(plain, plain_step), abs=1e-6)
    engine.close()


def test_a_config_section_of_another_optimizer_reads_back_as_written():
    section = {"type": "adagrad", "params": {"lr": 0.05, "lr_decay": 0.01}}
    cfg = load_config({**MB, "optimizer": section}, 1)
    assert cfg.optimizer.type == "Adagrad" and cfg.optimizer.arguments == section["params"]
    assert cfg.optimizer.params.lr == 0.05
    assert load_config({**MB, "optimizer": {"type": "Adagrad"}}, 1).optimizer.params.lr == 0.01  # torch's default
    dumped = cfg.optimizer.model_dump(mode="json")
    assert dumped["params"] == section["params"] and OptimizerConfig.model_validate(dumped) == cfg.optimizer


@pytest.mark.parametrize("section,words", [
    ({"type": "Lamb"}, ["'Lamb' is a DeepSpeed optimizer zero_core does not implement", "'SGD'", "'Lion'"]),
    ({"type": "Muon"}, ["'Muon' is a DeepSpeed optimizer zero_core does not implement"]),
    ({"type": "OneBitAdam"}, ["'OneBitAdam' is a DeepSpeed optimizer zero_core does not implement"]),
    ({"type": "LBFGS"}, ["'LBFGS' needs a closure", "'Adagrad'"]),
    ({"type": "Adafactor"}, ["torch.optim.Adafactor", "does not update each element on its own"]),
    ({"type": "sgd"}, ["'sgd' is not a torch.optim class", "write 'SGD'"]),
    ({"type": "Nonesuch"}, ["neither a torch.optim class nor a DeepSpeed optimizer", "'RMSprop'"]),
    ({"type": "SGD", "params": {"lr": 0.1, "betas": [0.9, 0.99]}},
     ["optimizer.params.betas is not an argument of SGD", "lr, momentum, dampening, weight_decay, nesterov"]),
    ({"type": "Lion", "params": {"eps": 1e-8}}, ["optimizer.params.eps is not an argument of Lion",
                                                "lr, betas, weight_decay"]),
    ({"type": "SGD", "params": {"max_grad_norm": 1.0}}, ["'gradient_clipping'"]),
    ({"type": "SGD", "params": {"lr": "0.1"}}, ["optimizer.params.lr must be a finite number"]),
    ({"type": "SGD", "params": {"nesterov": True}}, ["Nesterov momentum requires a momentum"]),
    ({"type": "AdamW", "params": {"momentum": 0.9}}, ["unknown key 'optimizer.params.momentum'"]),  # as strict
])
def test_what_zero_core_cannot_run_is_one_line(section, words):
    msg = error({**MB, "optimizer": section})
    assert all(w in msg for w in words), msg
    assert "problems" not in msg


def test_the_lr_range_test_section_is_checked():
    rt = {"type": "LRRangeTest"}
    assert "lr_range_test_step_size must be an integer >= 1" in error(
        {**MB, "scheduler": {**rt, "params": {"lr_range_test_step_size": 0}}})
    assert "warmup_num_steps does not apply to LRRangeTest" in error(
        {**MB, "scheduler": {**rt, "params": {"warmup_num_steps": 3}}})
    sched = load_config({**MB, "scheduler": {**rt, "params": {"lr_range_test_min_lr": [1e-3, 2e-3]}}}, 1).scheduler
    assert sched.model_dump()["params"] == {"lr_range_test_min_lr": [1e-3, 2e-3], "lr_range_test_step_size": 2000,
                                            "lr_range_test_step_rate": 1.0, "lr_range_test_staircase": False,
                                            "last_batch_iteration": -1}


@pytest.mark.parametrize("cfg,words", [
    ({"optimizer": {"type": "Adagrad"}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
     ["optimizer.type 'Adagrad' runs on the device shards", "remove zero_optimization.offload_optimizer"]),
    ({"optimizer": {"type": "Lion"}, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}},
     ["optimizer.type 'Lion'", "set optimizer.type to AdamW or Adam"]),
    ({"optimizer": {"type": "SGD"}, "scheduler": {"type": "LRRangeTest",
                                                  "params": {"lr_range_test_min_lr": [1e-3, 2e-3, 3e-3]}}},
     ["lr_range_test_min_lr has 3 values but the optimizer has 2 parameter groups"]),
])
def test_what_initialize_cannot_run_is_one_line(cfg, words):
    import zero_core.deepspeed as deepspeed

    model = torch.nn.Linear(3, 2)
    groups = [{"params": [model.weight]}, {"params": [model.bias], "weight_decay": 0.0}]
    with pytest.raises(ConfigError) as info:
        deepspeed.initialize(model=model, model_parameters=groups, config={**MB, **cfg})
    msg = str(info.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_a_config_sgds_groups_take_its_own_arguments_and_its_name_reads_as_deepspeeds():
    """Per-group `momentum` reaches torch's SGD (DeepSpeed hands model_parameters to it as they are), a key SGD does
    not take is one line listing SGD's, and optimizer_name() is 'SGD' (DeepSpeed lower-cases only its own names)."""
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    groups = [{"params": [model.weight], "momentum": 0.5}, {"params": [model.bias], "weight_decay": 0.0}]
    cfg = {**MB, "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}}
    engine, optimizer, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    assert [g["momentum"] for g in optimizer.param_groups] == [0.5, 0.9]
    assert engine.optimizer_name() == "SGD" and engine._config.optimizer_name == "SGD"
    engine.close()
    with pytest.raises(ConfigError) as info:
        deepspeed.initialize(model=model, model_parameters=[{"params": [model.weight], "betas": (0.9, 0.9)}],
                             config=cfg)
    assert "has the key 'betas', which SGD does not take; use " in str(info.value) and "momentum" in str(info.value)


@pytest.mark.parametrize("kind", ["SGD", "Lion", "Adagrad"])
def test_a_config_optimizer_under_fp16_skips_overflowing_steps_and_trains_alike_at_stages_1_and_3(kind):
    """fp16: a step whose scaled gradients overflow leaves the weights as they were (the loss scale halves), and
    the steps after train the same at stages 1 and 3."""
    import zero_core.deepspeed as deepspeed

    runs = {}
    for stage in (1, 3):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        first = [p.detach().clone() for p in net.parameters()]
        cfg = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage},
               "fp16": {"enabled": True, "initial_scale_power": 22},
               "optimizer": {"type": kind, "params": {"lr": 0.01}}}
        engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
        g = torch.Generator().manual_seed(1)
        losses, weights_after_skip = [], None
        for _ in range(12):
            x, y = torch.randn(4, 8, generator=g).half(), torch.randn(4, 4, generator=g)  # 2**22 overflows at first
            loss = torch.nn.functional.mse_loss(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
            if engine.skipped_steps == 1 and weights_after_skip is None:
                weights_after_skip = [v.float() for v in engine.full_state_dict().values()]
        assert weights_after_skip is not None and all(torch.equal(a, b.half().float())
                                                      for a, b in zip(weights_after_skip, first))
        assert 0 < engine.skipped_steps < 10, engine.skipped_steps  # it skipped, then trained
        runs[stage] = losses
        engine.close()
    assert runs[1] == runs[3] and runs[1][-1] != runs[1][0]

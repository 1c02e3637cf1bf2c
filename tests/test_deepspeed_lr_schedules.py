"""`deepspeed.runtime.lr_schedules` built by the script on its own optimizer: the same numbers as DeepSpeed's
classes (tests/fixtures/deepspeed_lr, recorded from DeepSpeed 0.19.8), and, passed to initialize, the same
training as the config's `scheduler` section, through a checkpoint too."""

from __future__ import annotations

import json

import pytest
import torch
from parity_workers import ds_config, make_batches, make_model

from helpers import FIXTURES
from zero_core import deepspeed
from zero_core.config_errors import ConfigError
from zero_core.deepspeed.runtime import lr_schedules

DATA = json.loads((FIXTURES / "deepspeed_lr" / "schedules.json").read_text())
DECAY = {"total_num_steps": 6, "warmup_min_lr": 1e-5, "warmup_max_lr": 2e-3, "warmup_num_steps": 3,
         "warmup_type": "linear"}


def _optimizer() -> torch.optim.Optimizer:
    model = torch.nn.Linear(3, 2)
    lrs = DATA["group_lrs"]
    return torch.optim.AdamW([{"params": [model.weight], "lr": lrs[0]},
                              {"params": [model.bias], "lr": lrs[1], "weight_decay": 0.0}], betas=tuple(DATA["betas"]))


@pytest.mark.parametrize("case", DATA["cases"], ids=lambda c: c["type"])
def test_each_scheduler_writes_deepspeeds_lr_and_beta1_into_the_groups(case):
    opt = _optimizer()
    scheduler = getattr(lr_schedules, case["type"])(opt, **case["params"])
    for n, want in enumerate(case["updates"]):
        assert [g["lr"] for g in opt.param_groups] == pytest.approx(want["lr"], rel=1e-12, abs=0), n
        assert [g["betas"][0] for g in opt.param_groups] == want["beta1"], n
        scheduler.step()
    start = case["params"].get("last_batch_iteration", -1)
    assert scheduler.state_dict() == {"last_batch_iteration": start + len(case["updates"])}
    assert scheduler.get_last_lr() == [g["lr"] for g in opt.param_groups]


def test_positional_arguments_follow_deepspeeds_order():
    by_name = lr_schedules.WarmupDecayLR(_optimizer(), **DECAY)
    positional = lr_schedules.WarmupDecayLR(_optimizer(), 6, 1e-5, 2e-3, 3, "linear")
    for _ in range(8):
        assert positional.get_lr() == by_name.get_lr()
        by_name.step(), positional.step()


def test_warmup_lr_without_a_maximum_warms_up_to_each_groups_own_lr():
    opt = _optimizer()
    scheduler = lr_schedules.WarmupLR(opt, warmup_min_lr=0.0, warmup_num_steps=4, warmup_type="linear")
    for _ in range(6):
        scheduler.step()
    assert [g["lr"] for g in opt.param_groups] == DATA["group_lrs"]


@pytest.mark.parametrize(
    "build, error, words",
    [
        (lambda o: lr_schedules.WarmupLR(o, warmup_min_lr=-1.0), ConfigError, "warmup_min_lr must be a number >= 0"),
        (lambda o: lr_schedules.WarmupLR(o, warmup_type="cubic"), ConfigError, "warmup_type must be one of"),
        (lambda o: lr_schedules.WarmupLR(o, cycle_min_lr=1e-3), TypeError, "unexpected argument 'cycle_min_lr'"),
        (lambda o: lr_schedules.WarmupDecayLR(o, warmup_max_lr=1e-3), TypeError, "needs total_num_steps"),
        (lambda o: lr_schedules.OneCycle(o, 1e-4), TypeError, "needs cycle_max_lr"),
        (lambda o: lr_schedules.WarmupLR(o, 0.0, 1e-3, 10, "log", -1, 5), TypeError, "takes 5 arguments"),
        (lambda o: lr_schedules.WarmupLR(object()), TypeError, "not a torch.optim.Optimizer"),
        (lambda o: lr_schedules.LRRangeTest(o), ValueError, "LRRangeTest is not supported"),
        (lambda o: lr_schedules.WarmupLR(o).load_state_dict({"last_batch_iteration": "x"}), ValueError,
         "last_batch_iteration must be an integer >= -1"),
    ],
)
def test_bad_arguments_are_one_line(build, error, words):
    with pytest.raises(error) as e:
        build(_optimizer())
    assert words in str(e.value) and "\n" not in str(e.value)


def _train(scheduler=None, steps: int = 6, resume_at: int | None = None, tmp=None) -> tuple[dict, list]:
    """AdamW at stage 2 with the config's WarmupDecayLR (`scheduler` None) or the one `scheduler(optimizer)`
    builds; with `resume_at`, a new engine (and scheduler) loads the checkpoint saved after that many steps."""
    cfg = ds_config(2, "fp32", 2)
    del cfg["optimizer"]  # the script's own AdamW, in both runs
    if scheduler is None:
        cfg["scheduler"] = {"type": "WarmupDecayLR", "params": DECAY}

    def build():
        model = make_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        made = scheduler(opt) if scheduler is not None else None
        engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=made, config=cfg)
        assert made is None or (isinstance(sched, lr_schedules.WarmupDecayLR) and sched.optimizer is opt)
        return engine

    engine, lrs = build(), []
    for step, (x, y) in enumerate(make_batches(steps, 2)):
        if step == resume_at:
            engine.save_checkpoint(tmp)
            engine.close()
            engine = build()
            engine.load_checkpoint(tmp)
        lrs.append(engine.get_lr())
        engine.backward(engine(x, y).loss)
        engine.step()
    state = engine.full_state_dict()
    engine.close()
    return state, lrs


@pytest.mark.parametrize("form", ["object", "callable"])
def test_a_scheduler_built_by_the_script_trains_as_the_configs(form, tmp_path):
    """Passed as an object, or as `lambda optimizer: scheduler` (DeepSpeed's callable form); then resumed from
    a checkpoint by a new engine whose new scheduler starts over: the lr sequence and the weights go on as
    without the break."""
    from_config, config_lrs = _train()
    if form == "object":
        built = lambda opt: lr_schedules.WarmupDecayLR(opt, **DECAY)  # noqa: E731
    else:
        built = lambda opt: (lambda o: lr_schedules.WarmupDecayLR(o, **DECAY))  # noqa: E731
    from_script, script_lrs = _train(built)
    resumed, resumed_lrs = _train(built, resume_at=3, tmp=tmp_path / "ckpt")
    assert script_lrs == resumed_lrs == config_lrs
    assert len({tuple(lr) for lr in config_lrs}) > 3  # the schedule did move the lr
    for k, v in from_config.items():
        assert torch.equal(from_script[k], v) and torch.equal(resumed[k], v), k

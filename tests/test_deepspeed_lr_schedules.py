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
        (lambda o: lr_schedules.LRRangeTest(o, lr_range_test_step_size=0), ValueError,
         "lr_range_test_step_size must be a positive integer"),
        (lambda o: lr_schedules.LRRangeTest(o, lr_range_test_min_lr=[1e-3]), ValueError,
         "expected 2 lr_range_test_min_lr (one per group)"),
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
        engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
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


WARM = {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2, "warmup_num_steps": 5, "total_num_steps": 10}
# DeepSpeed 0.19.8 on the CPU, the config's WarmupDecayLR(WARM), a loop calling engine.step() then scheduler.step():
# get_lr() and optimizer.param_groups[0]["lr"] after steps 1-3 (the script's step moves it a second iteration)
DS_STEPPED_TWICE = [0.00430676558073393, 0.00861353116146786, 0.01]


def _engine(config_optimizer: bool = True, scheduler=None, dtype: str = "fp32", offload: bool = False):
    """stage 2 with the config's WarmupDecayLR(WARM), or the scheduler `scheduler(optimizer)` builds on the script's
    AdamW (`config_optimizer` False: the script's AdamW with the config's schedule)."""
    cfg = ds_config(2, dtype, 2, **({"offload_optimizer": {"device": "cpu"}} if offload else {}))
    cfg["zero_core"] = {"overlap_host_update": 1.0} if offload else {}  # host updates started during backward
    if scheduler is None:
        cfg["scheduler"] = {"type": "WarmupDecayLR", "params": WARM}
    model, opt = make_model(), None
    if not config_optimizer or scheduler is not None:
        del cfg["optimizer"]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    return deepspeed.initialize(model=model, model_parameters=None if opt else model.parameters(), optimizer=opt,
                                lr_scheduler=scheduler(opt) if scheduler else None, config=cfg)


def _stepped_twice(scheduler=None, offload: bool = False) -> tuple[dict, list]:
    engine, optimizer, _, sched = _engine(False, scheduler, offload=offload)
    seen = []
    for x, y in make_batches(3, 2):
        engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
        engine.step()
        sched.step()  # the script's own step, besides the engine's
        seen.append((engine.get_lr(), [g["lr"] for g in optimizer.param_groups], sched.last_batch_iteration))
    state = engine.full_state_dict()
    engine.close()
    return state, seen


@pytest.mark.parametrize("offload", [False, True])
def test_a_scripts_own_step_of_the_configs_scheduler_moves_it_as_deepspeeds_does(offload):
    """Each step() of the scheduler initialize returned is one more iteration, as in DeepSpeed, whose engine steps
    it too: the lrs DeepSpeed reported, and the training of the same schedule built by the script."""
    state, seen = _stepped_twice(offload=offload)
    assert [lrs for lrs, _, _ in seen] == [[pytest.approx(lr, rel=1e-12, abs=0)] for lr in DS_STEPPED_TWICE]
    assert [groups for _, groups, _ in seen] == [lrs for lrs, _, _ in seen]
    assert [it for _, _, it in seen] == [1, 3, 5]
    built, built_seen = _stepped_twice(lambda opt: lr_schedules.WarmupDecayLR(opt, **WARM), offload)
    assert built_seen == seen
    for k, v in built.items():
        assert torch.equal(state[k], v), k


def test_the_configs_scheduler_jumps_saves_and_loads_its_position_as_deepspeeds_does():
    engine, optimizer, _, sched = _engine()
    oracle = lr_schedules.WarmupDecayLR(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3), **WARM)
    assert sched.state_dict() == {"last_batch_iteration": -1} and optimizer.param_groups[0]["lr"] == 0.0
    sched.step(6), oracle.step(6)
    assert sched.get_last_lr() == pytest.approx(oracle.get_last_lr(), rel=1e-12) == [optimizer.param_groups[0]["lr"]]
    x, y = make_batches(1, 2)[0]
    engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
    engine.step()
    oracle.step()
    assert sched.state_dict() == oracle.state_dict() == {"last_batch_iteration": 7}
    assert sched.get_lr() == pytest.approx(oracle.get_lr(), rel=1e-12)
    sched.load_state_dict({"last_batch_iteration": 2})
    oracle.load_state_dict({"last_batch_iteration": 2})
    assert sched.get_lr() == pytest.approx(oracle.get_lr(), rel=1e-12) == [engine.optimizer.param_groups[0]["lr"]]
    with pytest.raises(ValueError) as e:
        sched.step(last_batch_iteration=-2)
    assert "last_batch_iteration must be an integer >= -1" in str(e.value) and "\n" not in str(e.value)
    engine.close()


@pytest.mark.parametrize("config_optimizer", [True, False])
@pytest.mark.parametrize("count_on_device", [False, True])
def test_the_groups_carry_the_configs_scheduled_lr(config_optimizer, count_on_device, monkeypatch):
    """optimizer.param_groups (and engine.optimizer's) hold the next update's lr from construction on, as DeepSpeed's
    scheduler writes it. `count_on_device` plays fp16 on a GPU, where the applied count is a device tensor: the
    returned ZeroOptimizer's groups are then brought up to date when read, not after every step."""
    from zero_core.optim.facade import EngineScheduler

    monkeypatch.setattr(EngineScheduler, "_count_on_device", lambda self: count_on_device)
    engine, optimizer, _, _ = _engine(config_optimizer, dtype="fp16" if count_on_device else "fp32")
    lrs = []
    for x, y in [(None, None), *make_batches(3, 2)]:
        if x is not None:
            engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
            engine.step()
            assert (getattr(optimizer, "stale", None) is not None) == (count_on_device and config_optimizer)
        assert [g["lr"] for g in optimizer.param_groups] == engine.get_lr() == [
            g["lr"] for g in engine.optimizer.param_groups]
        lrs.append(engine.get_lr()[0])
    assert lrs[:2] == [0.0, 0.0] and 0 < lrs[2] < lrs[3]  # warmup_min_lr at iterations -1 and 0, then warm-up
    engine.close()


def test_loading_without_optimizer_states_takes_the_runs_counters_as_deepspeed_does(tmp_path):
    """load_optimizer_states=False with load_lr_scheduler_states=False keeps this engine's optimizer and schedule but
    takes the saved step counters; load_lr_scheduler_states=False alone keeps the schedule, whose next step follows the
    one update the saved groups' lr runs (tests/test_resume_without_scheduler.py); load_module_only keeps the counters
    too. The path loaded comes back as a str."""
    engine, *_ = _engine()
    for x, y in make_batches(3, 2):
        engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
        engine.step()
    saved_lr = engine.get_lr()
    engine.save_checkpoint(tmp_path, tag="t3")
    engine.close()
    fresh, *_ = _engine()
    first = [fresh.get_lr()]
    for x, y in make_batches(2, 2):
        fresh.backward(fresh(x.to(fresh.device), y.to(fresh.device)).loss)
        fresh.step()
        first.append(fresh.get_lr())
    fresh.close()
    for kw, steps in [({"load_optimizer_states": False, "load_lr_scheduler_states": False}, 3),
                      ({"load_lr_scheduler_states": False}, 3), ({"load_module_only": True}, 0)]:
        loaded, *_ = _engine()
        folder, _ = loaded.load_checkpoint(tmp_path, **kw)
        assert folder == str(tmp_path / "t3" / "rank_00000.safetensors")
        assert (loaded.global_steps, loaded.global_samples) == (steps, 2 * steps)
        lrs = [loaded.get_lr()]  # the schedule was not loaded: it goes on from where this engine's was
        for x, y in make_batches(2, 2):
            loaded.backward(loaded(x.to(loaded.device), y.to(loaded.device)).loss)
            loaded.step()
            lrs.append(loaded.get_lr())
        want = [saved_lr, *first[1:]] if kw == {"load_lr_scheduler_states": False} else first
        assert lrs == want and loaded.global_steps == steps + 2, kw
        loaded.close()


def test_a_checkpoint_keeps_the_iterations_a_script_added_to_the_configs_scheduler(tmp_path):
    """A loop stepping the config's scheduler besides the engine (two iterations per update): the checkpoint saves
    the position as DeepSpeed's state ({"last_batch_iteration": n}), and a resumed run trains on exactly as the
    uninterrupted one."""
    batches = make_batches(4, 2)

    def train(engine, sched, some) -> list:
        lrs = []
        for x, y in some:
            engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
            engine.step()
            sched.step()
            lrs.append(engine.get_lr())
        return lrs

    whole, _, _, sched = _engine()
    lrs = train(whole, sched, batches)
    want = whole.full_state_dict()
    whole.close()
    first, _, _, sched = _engine()
    train(first, sched, batches[:2])
    first.save_checkpoint(tmp_path, tag="t2")
    first.close()
    resumed, optimizer, _, sched = _engine()
    resumed.load_checkpoint(tmp_path)
    assert sched.state_dict() == {"last_batch_iteration": 3} and resumed.get_lr() == lrs[1]
    assert [g["lr"] for g in optimizer.param_groups] == lrs[1]
    assert train(resumed, sched, batches[2:]) == lrs[2:]
    for k, v in resumed.full_state_dict().items():
        assert torch.equal(v, want[k]), k
    resumed.close()

"""Resuming without the scheduler's or the optimizer's states, as DeepSpeed resumes: a torch scheduler passed to
initialize stays where it was while its groups take the loaded optimizer's lrs (without the scheduler's states), or
takes the saved state while its groups keep their lrs (without the optimizer's), and OneCycle's betas for the first
update after the load are those the groups then hold (the saved ones with the optimizer, else this engine's own).
A checkpoint saved by DeepSpeed gives its first update the lr its optimizer state holds, whatever this run's schedule
says at the saved position. get_lr(), the groups' lr and betas, and the weights after each later step equal
DeepSpeed's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zero_core import deepspeed

ONECYCLE = {"cycle_min_lr": 0.001, "cycle_max_lr": 0.02, "cycle_first_step_size": 3, "cycle_min_mom": 0.85,
            "cycle_max_mom": 0.95}
WARMUP = {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 4}
LOADS = {"nosched": {"load_lr_scheduler_states": False}, "noopt": {"load_optimizer_states": False}, "full": {}}
SAVED_BY_DEEPSPEED = Path(__file__).parent / "fixtures" / "deepspeed_resume_lr"  # make_resume_schedule_fixtures.py
UP, DOWN = 0.9166666666666666, 0.8833333333333333

# DeepSpeed 0.19.8 on the CPU (one gloo rank, ZeRO-2, fp32, torch_adam): _model(0) trains 5 steps on _batches(),
# is saved, and a new engine of _model(1) trains `pre` steps, loads with LOADS[load] and trains 3 more steps.
# (scheduler, load, pre): (get_lr() after the load, its groups' betas), then (get_lr(), betas, sum of the weights)
# after each later step (the groups' lr was get_lr()'s at every point). "lambda": LambdaLR(1 / (1 + step)) built on
# a torch Adam passed to initialize; "onecycle": the config's OneCycle(ONECYCLE) over its Adam.
DEEPSPEED = {
    ("lambda", "nosched", 2): ((0.003333333333333333, (0.9, 0.999)), [
        (0.005, (0.9, 0.999), 2.4539600737625733), (0.004, (0.9, 0.999), 2.4379533627070487),
        (0.003333333333333333, (0.9, 0.999), 2.4337267819792032)]),
    ("lambda", "noopt", 2): ((0.006666666666666666, (0.9, 0.999)), [
        (0.002857142857142857, (0.9, 0.999), 2.527666959911585), (0.0025, (0.9, 0.999), 2.5343956992728636),
        (0.0022222222222222222, (0.9, 0.999), 2.5430124551057816)]),
    ("onecycle", "nosched", 3): ((0.007333333333333328, (UP, 0.99)), [
        (0.01366666666666667, (DOWN, 0.99), 2.301975652575493), (0.007333333333333328, (UP, 0.99), 2.2591381510719657),
        (0.001, (0.95, 0.99), 2.2542770239524543)]),
    ("onecycle", "noopt", 2): ((0.013666666666666664, (DOWN, 0.99)), [
        (0.001, (0.95, 0.99), 2.530940626747906), (0.001, (0.95, 0.99), 2.5488407709635794),
        (0.001, (0.95, 0.99), 2.565354004036635)]),
}


def _model(shift: int) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with torch.no_grad():  # fixed weights, the same in both frameworks
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.sin(torch.arange(p.numel(), dtype=torch.float64) * 0.37 + i + shift).reshape(p.shape) * 0.5)
    return model


def _batches() -> list:
    x = torch.cos(torch.arange(10 * 16, dtype=torch.float64) * 0.11).reshape(10, 4, 4).float()
    y = torch.sin(torch.arange(10 * 12, dtype=torch.float64) * 0.23).reshape(10, 4, 3).float()
    return list(zip(x, y))


def _engine(shift: int, scheduler: str):
    model = _model(shift)
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    if scheduler == "lambda":
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        lambda_lr = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=lambda_lr,
                                                       config=config)
        return engine, optimizer
    config["optimizer"] = {"type": "Adam", "params": {"lr": 0.02, "weight_decay": 0.0, "torch_adam": True}}
    config["scheduler"] = {"type": "OneCycle", "params": ONECYCLE} if scheduler == "onecycle" else {
        "type": "WarmupLR", "params": WARMUP}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine, optimizer


def _train(engine, optimizer, batches) -> list:
    seen = []
    for x, y in batches:
        engine.backward(torch.nn.functional.mse_loss(engine(x.to(engine.device)), y.to(engine.device)))
        engine.step()
        assert [g["lr"] for g in optimizer.param_groups] == engine.get_lr()
        weights = sum(float(p.detach().double().sum()) for p in engine.module.parameters())
        seen.append((engine.get_lr()[0], tuple(optimizer.param_groups[0]["betas"]), weights))
    return seen


@pytest.mark.parametrize("case", sorted(DEEPSPEED), ids=lambda c: "-".join(map(str, c)))
def test_the_lrs_betas_and_weights_after_the_load_are_deepspeeds(case, tmp_path):
    scheduler, load, pre = case
    batches = _batches()
    engine, optimizer = _engine(0, scheduler)
    _train(engine, optimizer, batches[:5])
    engine.save_checkpoint(tmp_path, tag="t5")
    engine.close()
    engine, optimizer = _engine(1, scheduler)
    _train(engine, optimizer, batches[:pre])
    engine.load_checkpoint(tmp_path, **LOADS[load])
    first = (engine.get_lr()[0], tuple(optimizer.param_groups[0]["betas"]))
    seen = _train(engine, optimizer, batches[5:8])
    engine.close()
    want_first, want = DEEPSPEED[case]
    assert first == (pytest.approx(want_first[0], rel=1e-12, abs=0), pytest.approx(want_first[1], rel=1e-12))
    assert [(lr, betas) for lr, betas, _ in seen] == [
        (pytest.approx(lr, rel=1e-12, abs=0), pytest.approx(betas, rel=1e-12)) for lr, betas, _ in want]
    assert [w for *_, w in seen] == pytest.approx([w for *_, w in want], abs=1e-6)


# The same DeepSpeed run loading, instead, the checkpoint of make_resume_schedule_fixtures.py (saved under
# WarmupDecayLR, its groups' lr 0.017888888888888888) with the config's WarmupLR(WARMUP), whose lr at the saved position
# is 0.01. (load, pre): get_lr() after the load, then (get_lr(), sum of the weights) after each later step.
DEEPSPEED_SAVED = {
    ("nosched", 2): (0.017888888888888888, [(0.008132331253245204, 2.2242561522871256),
                                            (0.010000000000000002, 2.202512593008578),
                                            (0.010000000000000002, 2.2081133974716067)]),
    ("full", 0): (0.017888888888888888, [(0.010000000000000002, 2.2242561522871256),
                                         (0.010000000000000002, 2.19751909840852),
                                         (0.010000000000000002, 2.203755309805274)]),
}


@pytest.mark.parametrize("case", sorted(DEEPSPEED_SAVED), ids=lambda c: "-".join(map(str, c)))
def test_a_deepspeed_checkpoint_gives_the_lr_its_optimizer_state_held(case):
    load, pre = case
    batches = _batches()
    engine, optimizer = _engine(1, "warmup")
    _train(engine, optimizer, batches[:pre])
    engine.load_checkpoint(SAVED_BY_DEEPSPEED, **LOADS[load])
    first = engine.get_lr()[0]
    seen = _train(engine, optimizer, batches[5:8])
    engine.close()
    want_first, want = DEEPSPEED_SAVED[case]
    assert first == pytest.approx(want_first, rel=1e-12, abs=0)
    assert [lr for lr, *_ in seen] == [pytest.approx(lr, rel=1e-12, abs=0) for lr, _ in want]
    assert [w for *_, w in seen] == pytest.approx([w for _, w in want], abs=1e-6)


def test_saved_betas_are_taken_only_when_they_are_betas():
    """A checkpoint's saved group betas drive the first update after a load only when each is in [0, 1)."""
    from zero_core.host_schedules import checked_betas

    assert checked_betas([[0.9, 0.999], (0.0, 0.5)], 2) == [(0.9, 0.999), (0.0, 0.5)]
    for bad in ([[0.9, 1.0]], [[5.0, 0.999]], [[-0.1, 0.9]], [[float("nan"), 0.9]], [[0.9]], [[True, 0.9]], "0.9"):
        assert checked_betas(bad, 1) is None, bad
    assert checked_betas([[0.9, 0.999]], 2) is None  # one pair per group

"""`engine.load_checkpoint(dir, load_lr_scheduler_states=False)` and `load_optimizer_states=False` with the config's
scheduler, as DeepSpeed resumes: the first update after the load takes the lr the groups then hold (the saved
optimizer's groups' lr when the optimizer is loaded, this engine's own when it is not), and the scheduler's next step
writes its own lr, from the position it had (scheduler not loaded) or the saved one. get_lr(), the groups' lr and the
weights after each later step equal DeepSpeed's."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from checkpoints import manifest as mf
from zero_core import deepspeed

SCHEDULES = {
    "WarmupDecayLR": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.02, "warmup_num_steps": 3, "total_num_steps": 12},
    "WarmupLR": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.02, "warmup_num_steps": 3},
    "OneCycle": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.02, "cycle_first_step_size": 3, "cycle_momentum": False},
}
LOADS = {"nosched": {"load_lr_scheduler_states": False}, "noopt": {"load_optimizer_states": False}, "full": {}}

# DeepSpeed 0.19.8 on the CPU (one gloo rank, ZeRO-2), the run `_resume` mirrors: 5 steps, save, a new engine
# (another init) that takes `pre` steps, loads with LOADS[load], then 3 steps. (saved schedule, resumed schedule, load,
# pre): get_lr() after the load, then (get_lr(), sum of the weights) after each later step (the groups' lr was
# get_lr()'s at every point).
DEEPSPEED = {
    ("WarmupDecayLR", "WarmupDecayLR", "nosched", 0): (0.017888888888888888, [
        (0.001, -2.7555901925079525), (0.012987665317857687, -2.7577151953591965), (0.02, -2.7431806463282555)]),
    ("WarmupDecayLR", "WarmupDecayLR", "noopt", 0): (0.001, [
        (0.015777777777777776, -2.8082319180248305), (0.013666666666666667, -2.957911687786691),
        (0.011555555555555555, -2.9754472773056477)]),
    ("WarmupDecayLR", "WarmupDecayLR", "full", 0): (0.017888888888888888, [
        (0.015777777777777776, -2.7555901925079525), (0.013666666666666667, -2.7891177407000214),
        (0.011555555555555555, -2.7641551934648305)]),
    ("WarmupLR", "WarmupLR", "nosched", 2): (0.02, [
        (0.02, -2.7516200260724872), (0.02, -2.7970719472505152), (0.02, -2.7629274814389646)]),
    ("OneCycle", "OneCycle", "nosched", 0): (0.007333333333333328, [
        (0.007333333333333336, -2.8127491537015885), (0.013666666666666664, -2.823712346376851),
        (0.02, -2.809032679302618)]),
    ("OneCycle", "OneCycle", "noopt", 0): (0.001, [
        (0.001, -2.8410751338815317), (0.001, -2.85088367247954), (0.001, -2.8554902628529817)]),
    ("WarmupDecayLR", "WarmupLR", "nosched", 0): (0.017888888888888888, [
        (0.001, -2.7555901925079525), (0.012987665317857687, -2.7577151953591965), (0.02, -2.7431806463282555)]),
}


def _config(schedule: str) -> dict:
    return {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2},
            "optimizer": {"type": "Adam", "params": {"lr": 0.02, "weight_decay": 0.0, "torch_adam": True}},
            "scheduler": {"type": schedule, "params": SCHEDULES[schedule]}}


def _engine(seed: int, schedule: str):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=_config(schedule))
    return engine, optimizer


def _batches() -> list:
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(4, 12, generator=g), torch.randn(4, 1, generator=g)) for _ in range(8)]


def _train(engine, optimizer, batches) -> list:
    seen = []
    for x, y in batches:
        engine.backward(torch.nn.functional.mse_loss(engine(x.to(engine.device)), y.to(engine.device)))
        engine.step()
        weights = sum(float(p.detach().double().sum()) for p in engine.module.parameters())
        assert [g["lr"] for g in optimizer.param_groups] == engine.get_lr()
        seen.append((engine.get_lr()[0], weights))
    return seen


def _resume(tmp_path, saved: str, resumed: str, load: str, pre: int, edit=None) -> tuple:
    batches = _batches()
    engine, optimizer = _engine(0, saved)
    _train(engine, optimizer, batches[:5])
    engine.save_checkpoint(tmp_path, tag="t5")
    engine.close()
    if edit is not None:
        edit(tmp_path / "t5")
    engine, optimizer = _engine(123, resumed)
    _train(engine, optimizer, batches[:pre])
    engine.load_checkpoint(tmp_path, **LOADS[load])
    first = engine.get_lr()[0]
    assert [g["lr"] for g in optimizer.param_groups] == [first]
    seen = _train(engine, optimizer, batches[5:8])
    engine.close()
    return first, seen


def _check(got: tuple, want: tuple) -> None:
    assert got[0] == pytest.approx(want[0], rel=1e-12, abs=0)
    assert [lr for lr, _ in got[1]] == [pytest.approx(lr, rel=1e-12, abs=0) for lr, _ in want[1]]
    assert [w for _, w in got[1]] == pytest.approx([w for _, w in want[1]], abs=1e-6)


@pytest.mark.parametrize("case", sorted(DEEPSPEED), ids=lambda c: "-".join(map(str, c)))
def test_the_lrs_and_weights_after_the_load_are_deepspeeds(case, tmp_path):
    _check(_resume(tmp_path, *case), DEEPSPEED[case])


def test_a_checkpoint_without_the_groups_lrs_takes_the_schedules_lr_at_its_saved_position(tmp_path):
    """A zbench save that recorded no group lrs (as DeepSpeed checkpoints are read): where the schedule is the run's,
    its lr at the saved position is what DeepSpeed's saved groups hold."""

    def drop_group_lrs(folder) -> None:
        m = json.loads((folder / mf.MANIFEST).read_text())
        del m["optimizer"]["group_lrs"]
        data = json.dumps(m).encode()
        (folder / mf.MANIFEST).write_bytes(data)
        (folder / mf.CHECKSUM).write_text(f"{hashlib.sha256(data).hexdigest()}  {mf.MANIFEST}\n")

    case = ("WarmupDecayLR", "WarmupDecayLR", "nosched", 0)
    _check(_resume(tmp_path, *case, edit=drop_group_lrs), DEEPSPEED[case])

"""A zbench checkpoint keeps each group's weight_decay, eps and betas (a loop may have written them) and
load_checkpoint puts them back, as DeepSpeed's load restores its saved param_groups; a crafted record is refused in
one line before anything changes, and a checkpoint saved before the record existed still loads."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from schedule_cases import scheduled_config, small_model

from checkpoints import manifest as mf
from checkpoints.source import CheckpointError

# DeepSpeed 0.19.8 on CPU (one rank, fp32, "torch_adam"), the loop of _run below: the losses before the save, each
# group's [weight_decay, eps, betas] right after the load, and the losses after it.
DEEPSPEED = {
    "WarmupDecayLR": {  # ZeRO-1
        "before": [0.4568275213241577, 1.5773290395736694, 0.36606693267822266, 1.3615471124649048],
        "groups": [[0.5, 0.001, [0.5, 0.9]], [1.5, 0.001, [0.5, 0.9]]],
        "after": [0.895836591720581, 0.7702282667160034, 1.0240272283554077],
    },
    "OneCycle": {  # ZeRO-2 with optimizer offload; OneCycle has written its own betas over the loop's by the save
        "before": [0.4568275213241577, 1.5778695344924927, 0.3637239634990692, 1.338087558746338],
        "groups": [[0.5, 0.001, [0.875, 0.99]], [1.5, 0.001, [0.875, 0.99]]],
        "after": [0.8855520486831665, 0.8044697046279907, 1.039040207862854],
    },
}
SETUP = {"WarmupDecayLR": (1, False), "OneCycle": (2, True)}


def _make(schedule: str):
    import zero_core.deepspeed as deepspeed

    stage, offload = SETUP[schedule]
    model, cfg = small_model(), scheduled_config(schedule, stage, offload)
    groups = [{"params": [model[0].weight, model[2].weight]},
              {"params": [model[0].bias, model[2].bias], "weight_decay": 0.0}]
    return deepspeed.initialize(model=model, model_parameters=groups, config=cfg)[0]


def _train(engine, batches, out: list[float]) -> None:
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        out.append(loss.item())


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)) for _ in range(n)]


def _groups(engine) -> list[list]:
    return [[g["weight_decay"], g["eps"], list(g["betas"])] for g in engine.optimizer.param_groups]


def _save(schedule: str, folder, before: list[float]) -> None:
    """2 steps, the loop's values written into the groups, 2 more steps, a save."""
    engine = _make(schedule)
    batches = _batches(4)
    try:
        _train(engine, batches[:2], before)
        for i, group in enumerate(engine.optimizer.param_groups):
            group["weight_decay"], group["eps"], group["betas"] = 0.5 + i, 1e-3, (0.5, 0.9)
        _train(engine, batches[2:], before)
        engine.save_checkpoint(folder, tag="a")
    finally:
        engine.close()


@pytest.mark.parametrize("schedule", sorted(DEEPSPEED))
def test_the_groups_values_come_back_with_the_load_as_in_deepspeed(schedule, tmp_path):
    before, after = [], []
    _save(schedule, tmp_path, before)
    engine = _make(schedule)
    try:
        engine.load_checkpoint(tmp_path, tag="a")
        groups = _groups(engine)
        _train(engine, _batches(7)[4:], after)
    finally:
        engine.close()
    want = DEEPSPEED[schedule]
    assert before == pytest.approx(want["before"], abs=1e-6)
    assert groups == want["groups"]
    assert after == pytest.approx(want["after"], abs=1e-6)


def _craft(folder, change) -> None:
    path = folder / "a" / mf.MANIFEST
    m = json.loads(path.read_text())
    change(m["optimizer"])
    data = json.dumps(m, indent=1).encode()
    path.write_bytes(data)
    (folder / "a" / mf.CHECKSUM).write_text(f"{hashlib.sha256(data).hexdigest()}  {mf.MANIFEST}\n")


@pytest.mark.parametrize("record, words", [
    ("wide", "optimizer.group_values is not a list"),
    ([], "optimizer.group_values is not a list"),
    ([{"weight_decay": -1.0}, {}], r"optimizer.group_values\[0\].weight_decay"),
    ([{}, {"eps": float("nan")}], r"optimizer.group_values\[1\].eps"),
    ([{"betas": [0.9, 1.5]}, {}], r"optimizer.group_values\[0\].betas"),
    ([{"betas": [0.9]}, {}], r"optimizer.group_values\[0\].betas"),
    ([{"lr": 1.0}, {}], r"optimizer.group_values\[0\] is not a table"),
    ([3, {}], r"optimizer.group_values\[0\] is not a table"),
])
def test_a_crafted_record_is_refused_before_anything_changes(tmp_path, record, words):
    _save("WarmupDecayLR", tmp_path, [])
    _craft(tmp_path, lambda opt: opt.update(group_values=record))
    engine = _make("WarmupDecayLR")
    try:
        weights = [t.clone() for t in engine.module.state_dict().values()]
        groups, lrs = _groups(engine), engine.get_lr()
        with pytest.raises(CheckpointError, match=words) as caught:
            engine.load_checkpoint(tmp_path, tag="a")
        assert "\n" not in str(caught.value)
        assert all(torch.equal(a, b) for a, b in zip(weights, engine.module.state_dict().values()))
        assert _groups(engine) == groups and engine.get_lr() == lrs and engine.global_steps == 0
    finally:
        engine.close()


def test_a_checkpoint_without_the_record_loads_keeping_this_runs_values(tmp_path):
    _save("WarmupDecayLR", tmp_path, [])
    _craft(tmp_path, lambda opt: opt.pop("group_values"))
    engine = _make("WarmupDecayLR")
    try:
        engine.load_checkpoint(tmp_path, tag="a")
        assert engine.global_steps == 4
        assert _groups(engine) == [[0.01, 1e-8, [0.9, 0.999]], [0.0, 1e-8, [0.9, 0.999]]]
        _train(engine, _batches(5)[4:], [])
    finally:
        engine.close()

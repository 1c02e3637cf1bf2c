"""zero_core's Accelerator steps where Accelerate's DeepSpeed path does, on 2 gloo ranks, fp32 (ZeRO stage 2,
gradient_accumulation_steps 2, gradient_clipping 1.0): the update boundary is Accelerate's sync_gradients (the
dataloader's end, no accumulate()), a torch scheduler steps once per process per update, and one of DeepSpeed's
schedulers is stepped by the engine once per update. Expected values: DeepSpeed 0.19.8 + Accelerate on CPU, same
script (rank 0's loss and lr after each micro-batch, the sum of the final weights)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")

from dist_harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier (-m 'not slow')


def _loop(rank: int, world: int, sched: str, accum: bool, samples: int, epochs: int) -> dict:
    from accelerate.utils import DeepSpeedPlugin

    from zero_core.deepspeed.runtime.lr_schedules import WarmupDecayLR
    from zero_core.integrations.accelerate import Accelerator

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    sch = None
    if sched == "lambda":
        sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    elif sched == "dswd":
        sch = WarmupDecayLR(opt, total_num_steps=8, warmup_max_lr=0.01, warmup_num_steps=2)
    gen = torch.Generator().manual_seed(5)
    x_all, y_all = torch.randn(samples, 6, generator=gen), torch.randn(samples, 3, generator=gen)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_all, y_all), batch_size=2)
    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2, gradient_clipping=1.0)
    acc = Accelerator(deepspeed_plugin=plugin, cpu=True)
    prepared = acc.prepare(model, opt, loader, *([sch] if sch else []))
    model, opt, loader = prepared[:3]
    sch = prepared[3] if sch else None
    rows = []
    for _ in range(epochs):
        for x, y in loader:
            if accum:
                with acc.accumulate(model):
                    loss = (model(x) - y).pow(2).mean()
                    acc.backward(loss)
                    if acc.sync_gradients:
                        acc.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    if sch:
                        sch.step()
                    opt.zero_grad()
            else:
                loss = (model(x) - y).pow(2).mean()
                acc.backward(loss)
                opt.step()
                if sch:
                    sch.step()
                opt.zero_grad()
            lr = sch.get_last_lr() if sch else [g["lr"] for g in opt.param_groups]
            rows.append((float(loss), acc.sync_gradients, float(lr[0])))
    weights = acc.get_state_dict(model)
    return {"rows": rows, "weight_sum": sum(float(v.sum()) for v in weights.values())}


def _check(got: dict, losses: list[float], syncs: list[bool], lrs: list[float], weight_sum: float) -> None:
    assert [r[0] for r in got["rows"]] == pytest.approx(losses, abs=2e-6)
    assert [r[1] for r in got["rows"]] == syncs
    assert [r[2] for r in got["rows"]] == pytest.approx(lrs, abs=2e-6)
    assert got["weight_sum"] == pytest.approx(weight_sum, abs=2e-5)


def test_dataloader_end_is_an_update_boundary():
    # 20 samples, 2 ranks, batch 2: 5 micro-batches an epoch; the last one of each epoch updates
    got = run_ranks(_loop, 2, "none", True, 20, 2)
    losses = [0.866102, 2.214705, 0.498278, 1.303013, 0.833597, 0.711575, 1.904287, 0.503778, 1.112789, 0.692614]
    syncs = [False, True, False, True, True, False, True, False, True, True]
    _check(got, losses, syncs, [0.01] * 10, -2.85642)


def test_without_accumulate_every_micro_batch_updates():
    got = run_ranks(_loop, 2, "none", False, 32, 1)
    losses = [0.949031, 0.967462, 1.219166, 2.622555, 1.606445, 1.14069, 0.592369, 0.746679]
    _check(got, losses, [True] * 8, [0.01] * 8, -3.11739)


def test_torch_scheduler_steps_once_per_process_per_update():
    got = run_ranks(_loop, 2, "lambda", True, 32, 1)
    losses = [0.949031, 0.873122, 1.174199, 2.699071, 1.660887, 1.047698, 0.580848, 0.677401]
    lrs = [0.01, 0.003333, 0.003333, 0.002, 0.002, 0.001429, 0.001429, 0.001111]
    _check(got, losses, [False, True] * 4, lrs, -3.0041)


def test_deepspeed_scheduler_is_stepped_by_the_engine_once_per_update():
    got = run_ranks(_loop, 2, "dswd", True, 32, 1)
    losses = [0.949031, 0.873122, 1.130788, 2.766143, 1.624893, 0.970351, 0.566156, 0.648392]
    lrs = [0.0, 0.0, 0.0, 0.01, 0.01, 0.01, 0.01, 0.008333]
    _check(got, losses, [False, True] * 4, lrs, -2.84843)

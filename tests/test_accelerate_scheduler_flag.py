"""`Accelerator(step_scheduler_with_optimizer=False)` on zero_core's DeepSpeed path, as Accelerate's: a torch
scheduler is stepped once at every `scheduler.step()` of the script (update or not, never once per process), the
engine's updates use the lr it last set, and save_state/load_state keep its position; one of DeepSpeed's
schedulers is stepped by the engine once per update whatever the flag says.

Expected values: DeepSpeed 0.19.8 + Accelerate 1.15 on CPU (DS_ACCELERATOR=cpu; 2 processes over gloo, Accelerate's
backend choice patched to gloo as it picks DeepSpeed's multi-process path only on accelerators), the same script as
`_loop` (ZeRO stage 2, fp32, accumulation 2, clipping 1.0, AdamW, 8 micro-batches per rank): rank 0's (loss,
sync_gradients, lr) after each micro-batch, the scheduler's position and the sum of the final weights. "save" ran 3
micro-batches then save_state (mid-window: the third one's gradients are not kept, so the losses after the resume
part from the unbroken run's); "resume" a new process, load_state, then the remaining 5 (Accelerate keeps its
accumulation position: the first is a boundary)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")

from dist_harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier (-m 'not slow')


def _loop(rank: int, world: int, sched: str, mode: str, folder: str) -> dict:
    from accelerate.utils import DeepSpeedPlugin

    from zero_core.deepspeed.runtime.lr_schedules import WarmupDecayLR
    from zero_core.integrations.accelerate import Accelerator

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    if sched == "lambda":
        sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    else:
        sch = WarmupDecayLR(opt, total_num_steps=8, warmup_max_lr=0.01, warmup_num_steps=2)
    gen = torch.Generator().manual_seed(5)
    x_all, y_all = torch.randn(16 * world, 6, generator=gen), torch.randn(16 * world, 3, generator=gen)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_all, y_all), batch_size=2)
    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2, gradient_clipping=1.0)
    acc = Accelerator(deepspeed_plugin=plugin, cpu=True, step_scheduler_with_optimizer=False)
    model, opt, loader, sch = acc.prepare(model, opt, loader, sch)
    first, stop = {"full": (0, 99), "save": (0, 3), "resume": (3, 99)}[mode]
    if mode == "resume":
        acc.load_state(folder)
    rows = []
    for i, (x, y) in enumerate(loader):
        if not first <= i < stop:
            continue
        with acc.accumulate(model):
            loss = (model(x) - y).pow(2).mean()
            acc.backward(loss)
            opt.step()
            sch.step()
            opt.zero_grad()
        rows.append((loss.item(), acc.sync_gradients, float(sch.get_last_lr()[0])))
    if mode == "save":
        acc.save_state(folder)
    position = sch.scheduler.scheduler.state_dict() if sched == "lambda" else sch.scheduler.state_dict()
    weights = acc.get_state_dict(model)
    return {"rows": rows, "position": position, "weight_sum": sum(float(v.sum()) for v in weights.values())}


# (scheduler, processes, run): ((loss, sync_gradients, lr) per micro-batch, position, weight sum)
DS_RUNS = {
    ('lambda', 1, 'full'): (
        [(0.784195, False, 0.005), (1.183799, True, 0.003333), (0.184557, False, 0.0025),
         (0.895809, True, 0.002), (0.928517, False, 0.001667), (0.799789, True, 0.001429),
         (1.023548, False, 0.00125), (1.533973, True, 0.001111)],
        {'last_epoch': 8, '_step_count': 9}, -2.95728),
    ('lambda', 1, 'save'): (
        [(0.784195, False, 0.005), (1.183799, True, 0.003333), (0.184557, False, 0.0025)],
        {'last_epoch': 3, '_step_count': 4}, -2.89473),
    ('lambda', 1, 'resume'): (
        [(0.895809, True, 0.002), (0.928438, False, 0.001667), (0.798867, True, 0.001429),
         (1.028521, False, 0.00125), (1.542196, True, 0.001111)],
        {'last_epoch': 8, '_step_count': 9}, -2.95326),
    ('dswd', 1, 'full'): (
        [(0.784195, False, 0.0), (1.183799, True, 0.0), (0.210742, False, 0.0), (0.832409, True, 0.01),
         (0.927253, False, 0.01), (0.783659, True, 0.01), (1.055198, False, 0.01), (1.49639, True, 0.008333)],
        {'last_batch_iteration': 3}, -3.02356),
    ('dswd', 1, 'save'): (
        [(0.784195, False, 0.0), (1.183799, True, 0.0), (0.210742, False, 0.0)],
        {'last_batch_iteration': 0}, -2.82987),
    ('dswd', 1, 'resume'): (
        [(0.832409, True, 0.01), (0.927253, False, 0.01), (0.783659, True, 0.01), (1.067006, False, 0.01),
         (1.513266, True, 0.008333)],
        {'last_batch_iteration': 3}, -2.9959),
    ('lambda', 2, 'full'): (
        [(0.949031, False, 0.005), (0.873122, True, 0.003333), (1.151409, False, 0.0025),
         (2.731441, True, 0.002), (1.640916, False, 0.001667), (1.012421, True, 0.001429),
         (0.577799, False, 0.00125), (0.663057, True, 0.001111)],
        {'last_epoch': 8, '_step_count': 9}, -2.92941),
    ('lambda', 2, 'save'): (
        [(0.949031, False, 0.005), (0.873122, True, 0.003333), (1.151409, False, 0.0025)],
        {'last_epoch': 3, '_step_count': 4}, -2.89473),
    ('lambda', 2, 'resume'): (
        [(2.731441, True, 0.002), (1.637481, False, 0.001667), (1.008277, True, 0.001429),
         (0.580916, False, 0.00125), (0.662544, True, 0.001111)],
        {'last_epoch': 8, '_step_count': 9}, -2.90422),
    ('dswd', 2, 'full'): (
        [(0.949031, False, 0.0), (0.873122, True, 0.0), (1.130788, False, 0.0), (2.766143, True, 0.01),
         (1.624893, False, 0.01), (0.970351, True, 0.01), (0.566156, False, 0.01), (0.648392, True, 0.008333)],
        {'last_batch_iteration': 3}, -2.84843),
    ('dswd', 2, 'save'): (
        [(0.949031, False, 0.0), (0.873122, True, 0.0), (1.130788, False, 0.0)],
        {'last_batch_iteration': 0}, -2.82987),
    ('dswd', 2, 'resume'): (
        [(2.766143, True, 0.01), (1.624893, False, 0.01), (0.970351, True, 0.01), (0.57287, False, 0.01),
         (0.647105, True, 0.008333)],
        {'last_batch_iteration': 3}, -2.79056),
}


def _check(got: dict, expected: tuple) -> None:
    rows, position, weight_sum = expected
    assert [r[0] for r in got["rows"]] == pytest.approx([r[0] for r in rows], abs=2e-6)
    assert [r[1] for r in got["rows"]] == [r[1] for r in rows]
    assert [r[2] for r in got["rows"]] == pytest.approx([r[2] for r in rows], abs=2e-6)
    assert {k: got["position"][k] for k in position} == position
    assert got["weight_sum"] == pytest.approx(weight_sum, abs=2e-5)


@pytest.mark.parametrize("world", [1, 2])
def test_torch_scheduler_steps_at_every_call(tmp_path, world):
    _check(run_ranks(_loop, world, "lambda", "full", str(tmp_path)), DS_RUNS[("lambda", world, "full")])


@pytest.mark.parametrize("sched", ["lambda", "dswd"])  # DeepSpeed's schedulers: stepped per update whatever the flag
@pytest.mark.parametrize("world", [1, 2])
def test_position_survives_save_and_load(tmp_path, sched, world):
    if sched == "dswd":
        _check(run_ranks(_loop, world, sched, "full", str(tmp_path / "unbroken")), DS_RUNS[(sched, world, "full")])
    _check(run_ranks(_loop, world, sched, "save", str(tmp_path)), DS_RUNS[(sched, world, "save")])
    _check(run_ranks(_loop, world, sched, "resume", str(tmp_path)), DS_RUNS[(sched, world, "resume")])

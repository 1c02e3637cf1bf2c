"""Loss parity compares like with like: the same schedule and loss-scale policy, or a cell saying why not;
the ddp reference's fp16 loss scale is DeepSpeed's dynamic scaler, so it skips the steps the engines skip."""

from __future__ import annotations

import pytest
import torch

from helpers import table, tiny_scenario, zbench
from zbench.parity import add_parity
from zbench.variants.torch_optim import TorchOptim
from zero_core.loss_scaler import LossScaler
from zero_core.config import load_config

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}}


def ds(**extra) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": ADAMW,
        **extra,
    }


def row(name: str, engine: str, config: dict, losses: list[float]) -> dict:
    return {
        "variant": name,
        "engine": engine,
        "status": "ok",
        "batch": 4,
        "grad_accum": 1,
        "losses": losses,
        "ds_config": config,
    }


DECAY = {
    "type": "WarmupDecayLR",
    "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 1, "total_num_steps": 4},
}


def test_a_different_schedule_is_not_reported_ok_even_when_the_losses_agree():
    losses = [4.0, 3.9, 3.8, 3.7]
    rows = [
        row("ddp", "ddp", ds(), losses),
        row("same", "zero", ds(), [x + 1e-5 for x in losses]),
        row("decay", "deepspeed", ds(scheduler=DECAY), losses),
    ]
    add_parity(rows, 5e-2)
    assert rows[0]["parity_note"] == "reference"
    assert rows[1]["parity_note"] == "ok" and rows[1]["parity"] == pytest.approx(1e-5)
    assert (rows[2]["parity"], rows[2]["parity_note"]) == (None, "different schedule: not compared")


def test_the_same_schedule_written_otherwise_is_compared():
    """A WarmupLR whose warm-up ends before the first update gives a constant lr, like no scheduler."""
    flat = {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-3, "warmup_num_steps": 1}}
    rows = [row("ddp", "ddp", ds(), [4.0, 3.0]), row("zero2", "zero", ds(scheduler=flat), [4.0, 3.0])]
    add_parity(rows, 1e-3)
    assert rows[1]["parity_note"] == "ok"


@pytest.mark.parametrize(
    "change, note",
    [
        ({"gradient_clipping": 0.5}, "different schedule: not compared"),
        ({"fp16": {"enabled": True, "loss_scale_window": 100}}, "different loss scale: not compared"),
    ],
)
def test_other_recipes_are_named(change, note):
    ref = ds(fp16={"enabled": True})
    rows = [row("ddp", "ddp", ref, [4.0]), row("other", "zero", {**ref, **change}, [4.0])]
    add_parity(rows, 1e-3)
    assert rows[1]["parity_note"] == note and rows[1]["parity"] is None


def test_the_fp16_reference_skips_and_rescales_as_deepspeeds_scaler():
    """An inf gradient at the second update: the reference skips exactly that update, keeps the lr schedule
    where it was, and its loss scale follows zero_core's DeepSpeed-exact scaler (hysteresis 2: no halving yet)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    config = ds(fp16={"enabled": True, "initial_scale_power": 4, "hysteresis": 2, "loss_scale_window": 2})
    opt = TorchOptim(model.parameters(), config, 1, torch.device("cpu"))
    oracle = LossScaler(load_config(config, 1), torch.device("cpu"))
    scales, applied = [], []
    for step in range(5):
        before = model.weight.detach().clone()
        loss = model(torch.ones(2, 4)).sum() * (float("inf") if step == 1 else 1.0)
        opt.backward(loss)
        opt.step()
        oracle.update(torch.tensor([int(step == 1)]))
        scales.append(float(opt.stats()["loss_scale"]))
        assert scales[-1] == float(oracle.scale)
        applied.append(not torch.equal(before, model.weight.detach()))
    assert applied == [True, False, True, True, True]
    assert opt.stats()["skipped_steps"] == 1 and opt.applied == 4
    assert scales[0] == 16.0 and scales[1] == 16.0  # hysteresis 2: the first overflow keeps the scale


def test_fp16_run_compares_engines_with_the_ddp_reference(tmp_path):
    """Two CPU ranks in fp16: every engine's loss curve within the fp16 tolerance of ddp's (the reference scales
    as DeepSpeed does), and a row with another schedule says so instead of "ok"."""
    decay = tmp_path / "decay.json"
    decay.write_text(
        '{"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", '
        '"warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}}}'
    )
    path = tiny_scenario(
        tmp_path,
        "fp16",
        [
            {"name": "ddp", "engine": "ddp"},
            {"name": "zero2", "engine": "zero", "stage": 2},
            {"name": "zero2-decay", "engine": "zero", "stage": 2, "ds_config": str(decay)},
        ],
        samples=64,
        steps=6,
        precision="fp16",
    )
    proc = zbench("run", path, "--out", str(tmp_path / "runs"), "--wandb", "off", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table(proc.stdout)
    assert rows["zero2"]["Loss parity vs DDP"].endswith(" ok"), rows["zero2"]
    assert rows["zero2-decay"]["Loss parity vs DDP"] == "different schedule: not compared"


def test_rows_that_skipped_other_steps_are_compared_until_the_skips_differ():
    """zero3 skipped its third update (an fp16 overflow the fp32 reference did not have): from then on it trains
    other weights, so the losses after step 3 are not compared, and the cell says over which steps it compared."""
    fp16 = ds(fp16={"enabled": True})
    ref = {**row("ddp", "ddp", fp16, [4.0, 3.0, 2.5, 2.0, 1.5]), "skipped_by_step": [0, 0, 0, 0, 0]}
    diverged = {**row("zero3", "zero", fp16, [4.0, 3.001, 2.502, 2.6, 2.4]), "skipped_by_step": [0, 0, 1, 1, 1]}
    wrong = {**row("bad", "zero", fp16, [4.0, 3.5, 2.5, 2.0, 1.5]), "skipped_by_step": [0, 0, 1, 1, 1]}
    same = {**row("same", "zero", fp16, [4.0, 3.0, 2.5, 2.0, 1.9]), "skipped_by_step": [0, 0, 0, 0, 0]}
    rows = [ref, diverged, wrong, same]
    add_parity(rows, 5e-2)
    assert diverged["parity"] == pytest.approx(2e-3)
    assert diverged["parity_note"] == "ok over steps 1-3 (then skips differ)"
    assert wrong["parity"] == pytest.approx(0.5) and wrong["parity_note"].startswith("FAIL over steps 1-3")
    assert same["parity"] == pytest.approx(0.4) and same["parity_note"] == "FAIL"  # the same skips: every step


def test_skip_patterns_count_optimizer_steps_under_accumulation():
    fp16 = ds(fp16={"enabled": True}, gradient_accumulation_steps=2)
    ref = {**row("ddp", "ddp", fp16, [4.0, 4.1, 3.0, 3.1, 2.0, 2.1]), "grad_accum": 2, "skipped_by_step": [0, 0, 0]}
    other = {**row("zero2", "zero", fp16, [4.0, 4.1, 3.0, 3.1, 9.0, 9.0]), "grad_accum": 2,
             "skipped_by_step": [0, 1, 1]}
    add_parity([ref, other], 5e-2)
    assert other["parity"] == 0.0 and other["parity_note"] == "ok over steps 1-2 (then skips differ)"

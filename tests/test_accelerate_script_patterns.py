"""zero_core's Accelerator under loops written for Accelerate's DeepSpeed path, against DeepSpeed 0.19.8 + Accelerate
1.15 on the CPU running the same loops under torchrun (rank 0's loss per micro-batch, clip_grad_norm_'s norm per
update, the scheduler's lr after each micro-batch):

- Accelerate's `deepspeed_with_config_support.py` pattern: `DummyOptim` / `DummyScheduler` chosen because
  `accelerator.state.deepspeed_plugin.deepspeed_config` has those sections. The config also sets a micro-batch of 4
  (the dataloader gives 2) and accumulation 2 (the Accelerator was told 4): Accelerate keeps explicit config values
  and its `accumulate()` follows the config's accumulation.
- A `ReduceLROnPlateau` stepped with a metric after each epoch (2 ranks): as Accelerate's AcceleratedScheduler, each
  `step(metric)` after an update steps it once per process, so the lr halves at the first epoch's end already.
- `ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=2)` on 2 ranks: three `save_state()` leave
  checkpoint_1 and checkpoint_2, `load_state()` takes the newest and the next epoch repeats; `accumulate()` enters
  no `engine.no_sync()` (Accelerate's DeepSpeed path enters none at stages 2-3).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("accelerate")

from dist_harness import run_ranks  # noqa: E402

CONFIG = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                            "warmup_num_steps": "auto", "total_num_steps": "auto"}},
          "zero_optimization": {"stage": 2}}
CONFIG_SUPPORT = [(7.381868839263916, None, 0.0), (9.251479148864746, 3.1061675548553467, 0.0),
                  (0.8103122115135193, None, 0.0), (8.62451457977295, 3.7129223346710205, 0.01),
                  (9.30710220336914, None, 0.01), (6.058755397796631, 3.588573932647705, 0.01),
                  (7.8497443199157715, None, 0.01), (11.909903526306152, 4.8078532218933105, 0.008333333333333333)]
SAVED_EPOCHS_LOSSES = [7.381868839263916, 0.8103122115135193, 9.318196296691895, 7.882070064544678, 7.337751865386963,
                       0.7762827277183533, 9.264259338378906, 7.866090297698975, 7.330148220062256, 0.76340252161026,
                       9.238466262817383, 7.857577800750732]
AFTER_LOSSES = [7.325581073760986, 0.7560021877288818, 9.221355438232422, 7.851700305938721]
AFTER_NORMS = [1.6097601652145386, 2.9760470390319824]
PLATEAU_LOSSES = [7.381868839263916, 0.8103122115135193, 9.318196296691895, 7.882070064544678, 7.339430332183838,
                  0.7528316378593445, 9.166610717773438, 7.837155818939209, 7.31757116317749, 0.7212880253791809,
                  9.102133750915527, 7.814088344573975]
PLATEAU_LRS = [0.01] * 4 + [0.005] * 4 + [0.00125] * 4


def _model_and_data() -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    gen = torch.Generator().manual_seed(5)
    pairs = torch.utils.data.TensorDataset(torch.randn(16, 6, generator=gen), 3 * torch.randn(16, 3, generator=gen))
    return model, torch.utils.data.DataLoader(pairs, batch_size=2)


def _epoch(acc, model, opt, sched, loader) -> list[tuple]:
    rows = []
    for x, y in loader:
        with acc.accumulate(model):
            loss = (model(x) - y).pow(2).mean()
            acc.backward(loss)
            norm = acc.clip_grad_norm_(model.parameters(), 1.0) if acc.sync_gradients else None
            opt.step()
            sched.step()
            opt.zero_grad()
        rows.append((float(loss.detach()), norm, float(sched.get_last_lr()[0])))
    return rows


def _config_support(rank: int, world: int) -> dict:
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs
    from accelerate.utils.deepspeed import DummyOptim, DummyScheduler

    from zero_core.integrations.accelerate import Accelerator

    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=CONFIG), gradient_accumulation_steps=4,
                      kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    model, loader = _model_and_data()
    ds = acc.state.deepspeed_plugin
    opt_cls = torch.optim.AdamW if ds is None or "optimizer" not in ds.deepspeed_config else DummyOptim
    opt = opt_cls(model.parameters(), lr=0.01, weight_decay=0.01)
    if ds is None or "scheduler" not in ds.deepspeed_config:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    else:
        sched = DummyScheduler(opt, total_num_steps=8, warmup_num_steps=2)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    from accelerate.state import AcceleratorState

    return {"rows": _epoch(acc, model, opt, sched, loader), "gas": acc.gradient_accumulation_steps,
            "others_see": AcceleratorState().deepspeed_plugin}


def _plateau(rank: int, world: int) -> dict:
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

    from zero_core.integrations.accelerate import Accelerator

    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2, gradient_clipping=1.0)
    acc = Accelerator(deepspeed_plugin=plugin, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    model, loader = _model_and_data()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    rows = []
    for metric in (1.0, 2.0, 3.0):
        for x, y in loader:
            with acc.accumulate(model):
                loss = (model(x) - y).pow(2).mean()
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            rows.append((float(loss.detach()), float(opt.param_groups[0]["lr"])))
        sched.step(metric)
    return {"rows": rows, "last_lr": sched.get_last_lr()}


def _numbered_saves(rank: int, world: int, project_dir: str) -> dict:
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs, ProjectConfiguration

    from zero_core.integrations.accelerate import Accelerator

    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2, gradient_clipping=1.0)
    numbered = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=2)
    acc = Accelerator(deepspeed_plugin=plugin, project_config=numbered,
                      kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    model, loader = _model_and_data()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)

    def refused() -> None:
        raise AssertionError("accumulate() entered engine.no_sync()")

    model.no_sync = refused
    rows = []
    for _ in range(3):
        rows += _epoch(acc, model, opt, sched, loader)
        acc.save_state()
    acc.wait_for_everyone()
    folders = sorted(os.listdir(os.path.join(project_dir, "checkpoints")))
    after = _epoch(acc, model, opt, sched, loader)
    acc.load_state()
    again = _epoch(acc, model, opt, sched, loader)
    try:
        acc.load_state(os.path.join(project_dir, "missing"))
        missing = None
    except ValueError as e:
        missing = str(e)
    return {"rows": rows, "folders": folders, "after": after, "again": again, "iteration": acc.save_iteration,
            "missing": missing}


def test_a_loop_choosing_dummies_from_the_plugin_trains_with_the_configs_values():
    got = run_ranks(_config_support, 1)
    assert got["gas"] == 2 and got["others_see"] is None  # Accelerate's own state object still answers None
    assert [r[0] for r in got["rows"]] == pytest.approx([r[0] for r in CONFIG_SUPPORT], rel=1e-6)
    assert [r[1] is None for r in got["rows"]] == [r[1] is None for r in CONFIG_SUPPORT]
    assert [r[1] for r in got["rows"] if r[1] is not None] == pytest.approx(
        [r[1] for r in CONFIG_SUPPORT if r[1] is not None], rel=1e-6)
    assert [r[2] for r in got["rows"]] == pytest.approx([r[2] for r in CONFIG_SUPPORT], rel=1e-9)


def test_numbered_saves_rotate_and_the_newest_loads(tmp_path):
    got = run_ranks(_numbered_saves, 2, str(tmp_path))
    assert [r[0] for r in got["rows"]] == pytest.approx(SAVED_EPOCHS_LOSSES, rel=1e-6)
    assert got["folders"] == ["checkpoint_1", "checkpoint_2"] and got["iteration"] == 3
    assert [r[0] for r in got["after"]] == pytest.approx(AFTER_LOSSES, rel=1e-6)
    assert [r[1] for r in got["after"] if r[1] is not None] == pytest.approx(AFTER_NORMS, rel=1e-6)
    assert got["again"] == got["after"]
    assert got["missing"] is not None and "\n" not in got["missing"]
    assert got["missing"].startswith("load_state found no folder at ") and "missing" in got["missing"]


def test_a_plateau_schedule_steps_on_the_scripts_metric_once_per_process():
    got = run_ranks(_plateau, 2)
    assert [r[0] for r in got["rows"]] == pytest.approx(PLATEAU_LOSSES, rel=1e-6)
    assert [r[1] for r in got["rows"]] == pytest.approx(PLATEAU_LRS, rel=1e-12)
    assert got["last_lr"] == pytest.approx([0.0003125], rel=1e-12)

"""A loop that saves the prepared optimizer's and scheduler's `state_dict()` with torch.save and resumes from them in
a fresh Accelerator, run on zero_core's Accelerator (tests/test_integration_accelerate_state_dicts.py) and on
Accelerate with DeepSpeed 0.19.8 (tests/fixtures/make_accelerate_state_dict_fixtures.py records its values).

`kind`: "torch" is a torch AdamW with a LambdaLR; "config" is DummyOptim / DummyScheduler over the config's AdamW
and WarmupDecayLR. The optimizer's states load in DeepSpeed's form: a list of every rank's `state_dict()`, indexed
by rank (DeepSpeed's ZeRO optimizers take no single dict).
"""

from __future__ import annotations

import os
from typing import Any

import torch

SAMPLES, MICRO, SAVED_AFTER, MORE = 32, 2, 3, 3


def config(stage: int, kind: str) -> dict:
    cfg: dict = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                 "zero_optimization": {"stage": stage}}
    if stage == 3:  # DeepSpeed's get_state_dict gathers nothing without it
        cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    if kind == "config":
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01, "torch_adam": True}}
        cfg["scheduler"] = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                                                "warmup_num_steps": 2, "total_num_steps": 12}}
    return cfg


def _accelerator(real: bool, stage: int, kind: str) -> Any:
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

    if real:
        from accelerate import Accelerator
    else:
        from zero_core.integrations.accelerate import Accelerator
    return Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config(stage, kind)),
                       kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])


def _prepared(acc: Any, kind: str, weights: str | None = None) -> tuple:
    from accelerate.utils.deepspeed import DummyOptim, DummyScheduler

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    if weights is not None:  # the saved weights, into the model before prepare
        model.load_state_dict(torch.load(weights, weights_only=True))
    gen = torch.Generator().manual_seed(5)
    pairs = torch.utils.data.TensorDataset(torch.randn(SAMPLES, 6, generator=gen),
                                           3 * torch.randn(SAMPLES, 3, generator=gen))
    loader = torch.utils.data.DataLoader(pairs, batch_size=MICRO)
    if kind == "config":
        opt = DummyOptim(model.parameters())
        sched = DummyScheduler(opt)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return acc.prepare(model, opt, loader, sched)


def _steps(acc: Any, model: Any, opt: Any, sched: Any, batches: list) -> list[tuple[float, float]]:
    rows = []
    for x, y in batches:
        loss = (model(x) - y).pow(2).mean()
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        rows.append((float(loss.detach()), float(sched.get_last_lr()[0])))
    return rows


def plain(value: Any) -> Any:
    """A scheduler state as JSON data (a LambdaLR's holds None for its lambdas)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)


def save_then_go_on(rank: int, world: int, real: bool, stage: int, kind: str, folder: str) -> dict:
    """SAVED_AFTER updates, the optimizer's, scheduler's and model's states saved, then MORE updates."""
    acc = _accelerator(real, stage, kind)
    model, opt, loader, sched = _prepared(acc, kind)
    batches = list(loader)
    rows = _steps(acc, model, opt, sched, batches[:SAVED_AFTER])
    optimizer_state, scheduler_state = opt.state_dict(), sched.state_dict()
    torch.save(optimizer_state, os.path.join(folder, f"optimizer_{rank}.pt"))
    weights = acc.get_state_dict(model)
    if acc.is_main_process:
        torch.save(scheduler_state, os.path.join(folder, "scheduler.pt"))
        torch.save({k: v.detach().clone() for k, v in weights.items()}, os.path.join(folder, "model.pt"))
    acc.wait_for_everyone()
    rows += _steps(acc, model, opt, sched, batches[SAVED_AFTER:SAVED_AFTER + MORE])
    return {"rows": rows, "scheduler_state": plain(scheduler_state), "optimizer_state_keys": sorted(optimizer_state)}


def resume(rank: int, world: int, real: bool, stage: int, kind: str, folder: str, with_scheduler: bool = True) -> dict:
    """A fresh Accelerator: the saved weights into the model, the saved states into the prepared optimizer and
    (`with_scheduler`) scheduler, then the MORE updates that followed the save."""
    acc = _accelerator(real, stage, kind)
    model, opt, loader, sched = _prepared(acc, kind, os.path.join(folder, "model.pt"))
    # DeepSpeed's hold its own classes (weights_only cannot read them); zero_core's are plain tensors and numbers
    opt.load_state_dict([torch.load(os.path.join(folder, f"optimizer_{r}.pt"), weights_only=not real)
                         for r in range(world)])
    if with_scheduler:
        sched.load_state_dict(torch.load(os.path.join(folder, "scheduler.pt"), weights_only=not real))
    lr_after_load = float(sched.get_last_lr()[0])
    batches = list(loader)
    return {"rows": _steps(acc, model, opt, sched, batches[SAVED_AFTER:SAVED_AFTER + MORE]),
            "lr_after_load": lr_after_load}


def scheduler_after_prepare(rank: int, world: int, real: bool, stage: int, prepared_alone: bool = False) -> dict:
    """transformers' linear warmup built on the optimizer `prepare` returned (`prepared_alone`: then passed to a
    prepare() of its own), stepped by the loop: (loss, the scheduler's lr, the groups' lr) per update."""
    from transformers import get_linear_schedule_with_warmup

    acc = _accelerator(real, stage, "torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    gen = torch.Generator().manual_seed(5)
    pairs = torch.utils.data.TensorDataset(torch.randn(16, 6, generator=gen), 3 * torch.randn(16, 3, generator=gen))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    model, opt, loader = acc.prepare(model, opt, torch.utils.data.DataLoader(pairs, batch_size=MICRO))
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=8)
    prepared = acc.prepare(sched) if prepared_alone else sched  # DeepSpeed's path hands it back as it is
    rows = []
    for x, y in loader:
        loss = (model(x) - y).pow(2).mean()
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        rows.append((float(loss.detach()), float(sched.get_last_lr()[0]), float(opt.param_groups[0]["lr"])))
    return {"rows": rows, "is_optimizer": isinstance(opt, torch.optim.Optimizer), "same": prepared is sched}

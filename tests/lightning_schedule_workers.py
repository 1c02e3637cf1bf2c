"""Lightning runs for tests/test_lightning_loop_schedules.py (a helper module, not a test module): the regression
module of lightning_zero_workers with a scheduler Lightning's loop steps (per epoch, every 2 steps, on a
monitored value), trained by ZeroStrategy for 3 epochs of 8 batches, validated on 4 other batches."""

from __future__ import annotations

from typing import Any

import torch

from lightning_zero_workers import batches, module


def scheduled_module(kind: str) -> Any:
    lit = module()
    lit.lrs = []
    step = lit.training_step

    def training_step(batch: Any, batch_idx: int) -> Any:
        lit.lrs.append(lit.trainer.optimizers[0].param_groups[0]["lr"])  # the lr this update is applied with
        return step(batch, batch_idx)

    def configure_optimizers() -> Any:
        opt = torch.optim.AdamW(lit.parameters(), lr=0.05, weight_decay=0.01)
        if kind == "epoch":  # Lightning's default interval
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)]
        if kind == "every_2_steps":
            return {"optimizer": opt, "lr_scheduler": {
                "scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9), "interval": "step", "frequency": 2}}
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}

    lit.training_step, lit.configure_optimizers = training_step, configure_optimizers
    return lit


def _trainer(max_epochs: int, folder: str | None = None, config: dict | None = None, accumulate: int = 1) -> Any:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from zero_core.integrations.lightning import ZeroStrategy

    callbacks = [ModelCheckpoint(dirpath=folder, save_last=True)] if folder else []
    return L.Trainer(strategy=ZeroStrategy(stage=2, config=config, process_group_backend="gloo"), accelerator="cpu",
                     devices=1, max_epochs=max_epochs, logger=False, enable_checkpointing=bool(folder),
                     callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, accumulate_grad_batches=accumulate)


def validation_batches() -> Any:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


def fit_scheduled(rank: int, world: int, kind: str) -> dict:
    """Every 4th loss and lr of 3 epochs, or the one-line message a refusal raised."""
    lit = scheduled_module(kind)
    try:
        _trainer(3).fit(lit, batches(), validation_batches())
    except ValueError as refusal:
        return {"refused": str(refusal)}
    return {"losses": lit.losses[::4], "lrs": lit.lrs[::4]}


def resume_last(rank: int, world: int, folder: str) -> dict:
    """2 epochs with a per-epoch StepLR and ModelCheckpoint(save_last=True), then a fresh Trainer's third epoch
    from ckpt_path="last": every 4th loss and lr of the resumed epoch."""
    _trainer(2, folder).fit(scheduled_module("epoch"), batches(), validation_batches())
    lit = scheduled_module("epoch")
    _trainer(3, folder).fit(lit, batches(), validation_batches(), ckpt_path="last")
    return {"losses": lit.losses[::4], "lrs": lit.lrs[::4]}


def fit_with_config(rank: int, world: int, config: dict | None) -> Any:
    """The losses of one epoch with accumulate_grad_batches=2, or the one-line message a refusal raised."""
    lit = module()
    try:
        _trainer(1, config=config, accumulate=2).fit(lit, batches())
    except ValueError as refusal:
        return str(refusal)
    return lit.losses

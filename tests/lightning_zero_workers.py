"""Lightning runs for tests/test_lightning_zero_strategy.py (a helper module, not a test module): a two-layer
regression LightningModule (8 -> 16 -> 1, AdamW lr 0.05, 8 batches of 4) trained by ZeroStrategy on the ranks
dist_harness started, with the seeds the DeepSpeedStrategy reference runs used."""

from __future__ import annotations

from typing import Any

import torch


def module(sched: bool = False) -> Any:
    import lightning as L

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.losses = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1), []

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

        def training_step(self, batch, index):
            loss = torch.nn.functional.mse_loss(self(batch[0]).float(), batch[1])
            self.losses.append(loss.item())
            return loss

        def validation_step(self, batch, index):
            self.log("val_loss", torch.nn.functional.mse_loss(self(batch[0]).float(), batch[1]))

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=0.05, weight_decay=0.01)
            if not sched:
                return opt
            return {"optimizer": opt, "lr_scheduler": {
                "scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)), "interval": "step"}}

    torch.manual_seed(0)
    return Regression()


def batches() -> Any:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


def trainer(strategy: Any, precision: str = "32-true") -> Any:
    import lightning as L

    return L.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=1, precision=precision,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0)


def fit_losses(rank: int, world: int, precision: str, config: dict | None) -> Any:
    """The training losses, or the one-line message a refusal raised."""
    from zero_core.integrations.lightning import ZeroStrategy

    lit = module()
    try:
        trainer(ZeroStrategy(stage=2, config=config, process_group_backend="gloo"), precision).fit(lit, batches())
    except ValueError as refusal:
        return str(refusal)
    return lit.losses


def refusal_of_config_optimizer_with_module_scheduler(rank: int, world: int) -> str:
    from zero_core.integrations.lightning import ZeroStrategy

    config = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    try:
        trainer(ZeroStrategy(config=config, process_group_backend="gloo")).fit(module(sched=True), batches())
    except ValueError as refusal:
        return str(refusal)
    return "trained"


def validate_fresh(rank: int, world: int, folder: str, stage: int) -> dict:
    """validate() after fit on the fitting Trainer, and on a fresh Trainer given the saved folder as ckpt_path."""
    from zero_core.integrations.lightning import ZeroStrategy

    lit, first = module(), trainer(ZeroStrategy(stage=stage, process_group_backend="gloo"))
    first.fit(lit, batches())
    first.save_checkpoint(folder)
    after_fit = first.validate(lit, batches())[0]["val_loss"]
    fresh = trainer(ZeroStrategy(stage=stage, process_group_backend="gloo"))
    untrained = fresh.validate(module(), batches())[0]["val_loss"]
    from_folder = trainer(ZeroStrategy(stage=stage, process_group_backend="gloo")).validate(
        module(), batches(), ckpt_path=folder)[0]["val_loss"]
    return {"after_fit": after_fit, "untrained": untrained, "from_folder": from_folder}


def cpu_checkpointing_after_fit(rank: int, world: int) -> bool:
    """Whether deepspeed.checkpointing keeps checkpoint inputs on the host once ZeroStrategy(cpu_checkpointing=True)
    has set the engine up, as Lightning's DeepSpeedStrategy configures it."""
    from zero_core.deepspeed import checkpointing
    from zero_core.integrations.lightning import ZeroStrategy

    checkpointing.configure(None)  # the defaults: off
    trainer(ZeroStrategy(stage=2, cpu_checkpointing=True, process_group_backend="gloo")).fit(module(), batches())
    return checkpointing._cpu_checkpoint

"""Lightning runs for tests/test_integration_lightning.py (a helper module, not a test module): a tiny GPT-2 in a
LightningModule with AdamW and a step-interval LambdaLR, trained by Lightning's DDPStrategy or ZeroStrategy on
the ranks dist_harness started (Lightning sees LOCAL_RANK and does not launch processes itself)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

import trainer_workers as tw

SAMPLES, MICRO, ACCUMULATE = 16, 2, 2  # per rank: 4 batches an epoch, 2 updates




def module(micro: int = MICRO) -> "object":
    import lightning as L

    class Lit(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.losses = tw.tiny_model("gpt2"), []

        def training_step(self, batch, index):
            loss = self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            self.losses.append(float(loss))
            return loss

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.1)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        def train_dataloader(self):
            return torch.utils.data.DataLoader(tw.Samples("gpt2", SAMPLES * 2, 1), batch_size=micro)

    return Lit()


def fit(strategy: object, world: int, epochs: int, ckpt_path: str | None = None, save_to: str | None = None,
        micro: int = MICRO, clip: float | None = 1.0) -> dict:
    import lightning as L

    lit = module(micro)
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_epochs=epochs, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        gradient_clip_val=clip, accumulate_grad_batches=ACCUMULATE, num_sanity_val_steps=0)
    trainer.fit(lit, ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    engine = getattr(trainer.strategy, "engine", None)
    weights = engine.full_state_dict() if engine is not None else {
        k: v.detach().clone() for k, v in lit.state_dict().items()}
    every = [None] * world
    dist.all_gather_object(every, lit.losses)
    return {"losses": [math.fsum(s) / world for s in zip(*every)], "weights": weights, "step": trainer.global_step,
            "clipping": engine.config.gradient_clipping if engine is not None else None}


def clipping(rank: int, world: int) -> list:
    """The clipping ZeroStrategy's engine applies for Trainer(gradient_clip_val=None / 0.5), and for a config
    whose gradient_clipping is "auto" with no gradient_clip_val."""
    from zero_core.integrations.lightning import ZeroStrategy

    got = [fit(ZeroStrategy(stage=2, process_group_backend="gloo"), world, 1, clip=clip)["clipping"]
           for clip in (None, 0.5)]
    auto = ZeroStrategy(config={"zero_optimization": {"stage": 2}, "gradient_clipping": "auto"},
                        process_group_backend="gloo")
    return got + [fit(auto, world, 1, clip=None)["clipping"]]


def run(rank: int, world: int, stage: int, folder: str) -> dict:
    """DDP for 4 epochs; ZeroStrategy for 2, a save, and a resume to 4 epochs from the saved folder."""
    from lightning.pytorch.strategies import DDPStrategy

    from zero_core.integrations.lightning import ZeroStrategy

    ddp = fit(DDPStrategy(process_group_backend="gloo"), world, 4)
    first = fit(ZeroStrategy(stage=stage, process_group_backend="gloo"), world, 2, save_to=f"{folder}/zero.ckpt")
    resumed = fit(ZeroStrategy(stage=3 if stage != 3 else 2, process_group_backend="gloo"), world, 4,
                  ckpt_path=f"{folder}/zero.ckpt")
    return {"ddp": ddp, "first": first, "resumed": resumed}


def resume_alone(rank: int, world: int, stage: int, folder: str) -> dict:
    """One rank resumes the 2-rank checkpoint at `stage`: micro-batches of both ranks' samples (rank r had
    samples r, r+2, ...), so each update sees the same 8 samples and each logged loss is the 2-rank mean."""
    from zero_core.integrations.lightning import ZeroStrategy

    return fit(ZeroStrategy(stage=stage, process_group_backend="gloo"), world, 4, ckpt_path=f"{folder}/zero.ckpt",
               micro=MICRO * 2)


def resume_deepspeed(rank: int, world: int, folder: str, stage: int) -> dict:
    """ZeroStrategy at `stage` resumes the Lightning DeepSpeedStrategy checkpoint in `folder` (ckpt_path=) and trains on
    to step 4, as tests/fixtures/make_lightning_deepspeed_fixtures.py had Lightning do; the trained weights."""
    import sys
    from pathlib import Path

    import lightning as L

    from zero_core.integrations.lightning import ZeroStrategy

    sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
    from make_lightning_deepspeed_fixtures import CKPT
    from make_lightning_fixtures import tiny_lightning_module

    data = torch.utils.data.TensorDataset(torch.randint(0, 11, (8, 5), generator=torch.Generator().manual_seed(100)))
    strategy = ZeroStrategy(config={"zero_optimization": {"stage": stage}, "gradient_clipping": 0.0})
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=4, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(tiny_lightning_module()(), torch.utils.data.DataLoader(data, batch_size=2),
                ckpt_path=str(Path(folder) / CKPT))
    trained = {n for n, p in trainer.lightning_module.named_parameters() if p.requires_grad}
    state = trainer.strategy.engine.full_state_dict()
    return {"step": trainer.global_step, "weights": {k: v for k, v in state.items() if k in trained}}



def resume_model_parallel(rank: int, world: int, stage: int) -> dict:
    """ZeroStrategy at `stage` resumes the Lightning ModelParallelStrategy (FSDP2) checkpoint of
    tests/fixtures/lightning/model_parallel (ckpt_path=) and trains on to step 4 on the data the fixture script's
    --continue gave Lightning's own resume; the trained weights."""
    import sys
    from pathlib import Path

    import lightning as L

    from zero_core.integrations.lightning import ZeroStrategy

    fixtures = Path(__file__).parent / "fixtures"
    sys.path.insert(0, str(fixtures))
    from make_lightning_fixtures import CKPT, resume_data, tiny_lightning_module

    strategy = ZeroStrategy(config={"zero_optimization": {"stage": stage}, "gradient_clipping": 0.0})
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=4, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(tiny_lightning_module()(), torch.utils.data.DataLoader(resume_data(), batch_size=2),
                ckpt_path=str(fixtures / "lightning" / "model_parallel" / CKPT))
    trained = {n for n, p in trainer.lightning_module.named_parameters() if p.requires_grad}
    state = trainer.strategy.engine.full_state_dict()
    return {"step": trainer.global_step, "weights": {k: v for k, v in state.items() if k in trained}}


def convert_and_load(rank: int, world: int, folder: str) -> dict:
    """ZeroStrategy trains a module with a hyper-parameter for 1 epoch and saves; the folder is converted with
    zero_core's convert_zero_checkpoint_to_fp32_state_dict and reopened with load_from_checkpoint."""
    import lightning as L

    from zero_core.integrations.lightning import ZeroStrategy, convert_zero_checkpoint_to_fp32_state_dict

    class Sized(type(module())):
        def __init__(self, width: int = 16) -> None:
            super().__init__()
            self.save_hyperparameters()

    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=ZeroStrategy(stage=3), max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Sized(width=32))
    trainer.save_checkpoint(f"{folder}/zero.ckpt")
    written = convert_zero_checkpoint_to_fp32_state_dict(f"{folder}/zero.ckpt", f"{folder}/model.pt")
    loaded = Sized.load_from_checkpoint(f"{folder}/model.pt")  # strict: every entry of the module's state_dict
    return {"weights": trainer.strategy.engine.full_state_dict(), "loaded": loaded.state_dict(),
            "width": loaded.hparams.width, "keys": sorted(written), "global_step": written["global_step"]}

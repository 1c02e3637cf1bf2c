"""The states of the config's SGD (momentum), Adagrad (sums and step) and Lion (momentum) go through
engine.save_checkpoint / load_checkpoint: a run resumed from step 3, at another stage and on another number of
ranks, trains on as the uninterrupted run does."""

from __future__ import annotations

import pytest
import torch

from dist_harness import run_ranks
from rank_mean_step import step_with_mean_loss

OPTIMIZERS = {
    "sgd": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}},
    "adagrad": {"type": "Adagrad", "params": {"lr": 0.05, "initial_accumulator_value": 0.1}},
    "lion": {"type": "Lion", "params": {"lr": 0.01, "betas": [0.9, 0.95], "weight_decay": 0.1}},
}
STEPS, SAVED_AT, GLOBAL_BATCH = 5, 3, 4


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g))
            for _ in range(STEPS)]


def _train(rank: int, world: int, kind: str, stage: int, folder: str, load: bool) -> list[float]:
    """The losses of the steps this run takes: all of them, saving after SAVED_AT, or (`load`) those after it."""
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    micro = GLOBAL_BATCH // world
    cfg = {"train_micro_batch_size_per_gpu": micro, "gradient_clipping": 0.0, "zero_optimization": {"stage": stage},
           "optimizer": OPTIMIZERS[kind]}
    engine, optimizer, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    assert type(optimizer).__name__ == OPTIMIZERS[kind]["type"]  # the config's, stepping on the shards
    if load:
        engine.load_checkpoint(folder)
    losses = []
    for step, (x, y) in enumerate(_batches()[engine.global_steps:], start=engine.global_steps):
        rows = slice(rank * micro, (rank + 1) * micro)  # this rank's share of the global batch
        loss = torch.nn.functional.mse_loss(engine(x[rows]), y[rows])
        losses.append(step_with_mean_loss(engine, loss, world))
        if step + 1 == SAVED_AT and not load:
            engine.save_checkpoint(folder)
    engine.close()
    return losses


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_a_resumed_run_trains_on_as_the_uninterrupted_one(kind, tmp_path):
    whole = _train(0, 1, kind, 2, str(tmp_path), load=False)
    resumed = _train(0, 1, kind, 1, str(tmp_path), load=True)
    assert len(resumed) == STEPS - SAVED_AT and resumed == pytest.approx(whole[SAVED_AT:], abs=1e-6)


def _save_on_two_ranks(rank: int, world: int, folders: dict[str, str]) -> dict[str, list[float]]:
    return {kind: _train(rank, world, kind, 2, folder, load=False) for kind, folder in folders.items()}


def test_states_saved_on_two_ranks_resume_on_one(tmp_path):
    folders = {kind: str(tmp_path / kind) for kind in OPTIMIZERS}
    whole = run_ranks(_save_on_two_ranks, 2, folders)
    for kind, folder in folders.items():
        resumed = _train(0, 1, kind, 1, folder, load=True)
        assert resumed == pytest.approx(whole[kind][SAVED_AT:], abs=1e-6), kind

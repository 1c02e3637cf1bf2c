"""Activation checkpointing (`GPT.gradient_checkpointing_enable`, scenario key `gradient_checkpointing`):
the same losses and gradients for fewer saved activations, alone, under zero_core at stage 3 (units
released and re-gathered around the recomputation) and with optimizer offload, and in a `zbench run`."""

from __future__ import annotations

import pytest
import torch

from dist_harness import run_ranks
from helpers import table, tiny_scenario, zbench
from parity_workers import ds_config, make_batches, make_model, train_local

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')


def _loss_grads_saved(recompute: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    model = make_model()
    if recompute:
        model.gradient_checkpointing_enable()
    x, y = make_batches(1, 4)[0]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        loss = model(x, y).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, sum(saved)


def test_recomputation_gives_the_same_loss_and_gradients_for_fewer_saved_activations():
    loss, grads, saved = _loss_grads_saved(False)
    loss_r, grads_r, saved_r = _loss_grads_saved(True)
    assert torch.equal(loss, loss_r)
    assert grads.keys() == grads_r.keys()
    for k in grads:
        torch.testing.assert_close(grads_r[k], grads[k], rtol=0, atol=1e-6)
    assert saved_r < saved / 2  # only the blocks' inputs (and the head) are kept


def _train(rank: int, world: int, stage: int, recompute: bool, zero: dict) -> tuple[list[float], dict]:
    import zero_core

    micro = 2
    model = make_model()
    if recompute:
        model.gradient_checkpointing_enable()
    engine = zero_core.initialize(model, ds_config(stage, "fp32", micro, **zero))
    losses = train_local(engine, rank, world, micro, 3)
    state = engine.full_state_dict()
    engine.close()
    return losses, state


@pytest.mark.parametrize(
    "zero",
    [{"stage3_param_persistence_threshold": 0}, {"offload_optimizer": {"device": "cpu"}}],
    ids=["units-released", "optimizer-offload"],
)
def test_stage3_with_recomputation_trains_as_without(zero):
    plain = run_ranks(_train, 2, 3, False, zero)
    recomputed = run_ranks(_train, 2, 3, True, zero)
    assert recomputed[0] == pytest.approx(plain[0], rel=0, abs=1e-6)
    for k, v in plain[1].items():
        torch.testing.assert_close(recomputed[1][k], v, rtol=0, atol=1e-6)


def test_scenario_key_turns_recomputation_on_and_says_so(tmp_path):
    path = tiny_scenario(
        tmp_path,
        "recompute",
        [{"name": "ddp", "engine": "ddp"}, {"name": "zero3", "engine": "zero", "stage": 3}],
        gradient_checkpointing=True,
    )
    proc = zbench("run", path, "--out", str(tmp_path / "runs"), "--wandb", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table(proc.stdout)
    assert rows["zero3"]["Method"].endswith("+ activation checkpointing"), rows["zero3"]
    assert rows["ddp"]["Method"].endswith("+ activation checkpointing")
    assert rows["zero3"]["Loss parity vs DDP"].endswith(" ok"), rows["zero3"]

"""The GPT's training loss taken a slice of tokens at a time (zbench/models/sliced_loss.py): the same loss and
gradients as one cross-entropy over the full logits, without ever saving logits of every token, alone and
under zero_core at stage 3 (units released, optimizer offloaded)."""

from __future__ import annotations

import json

import pytest
import torch

import zbench.models.sliced_loss as sliced
from dist_harness import run_ranks
from helpers import table, tiny_scenario, zbench
from parity_workers import TINY, ds_config, make_batches, make_model, train_local

SMALL_SLICES = 4 * TINY.vocab_size * 5  # 5 tokens a slice: a batch of 2 x 9 tokens takes 4, the last short


def _loss_grads_logits_saved(x, y) -> tuple[torch.Tensor, torch.Tensor | None, dict, int]:
    """Loss, logits, gradients, and how many logit-shaped elements forward kept for backward."""
    model = make_model()
    saved: list[int] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        if t.dim() and t.shape[-1] == TINY.vocab_size:
            saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = model(x, y)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), out.logits, grads, sum(saved)


def test_sliced_loss_and_gradients_equal_the_full_cross_entropy_without_saving_all_logits(monkeypatch):
    x, y = make_batches(1, 2)[0]
    y = y.clone()  # a view of the same tokens as x
    y[0, :3] = sliced.IGNORE_INDEX  # padded positions count in neither the sum nor the mean
    loss, logits, grads, saved = _loss_grads_logits_saved(x, y)
    assert logits is not None and saved >= y.numel() * TINY.vocab_size  # the log-softmax of every token

    monkeypatch.setattr(sliced, "SLICE_BYTES", SMALL_SLICES)
    loss_s, logits_s, grads_s, saved_s = _loss_grads_logits_saved(x, y)
    assert logits_s is None  # never materialised
    assert saved_s == 0  # each slice's logits are recomputed in backward
    torch.testing.assert_close(loss_s, loss, rtol=0, atol=1e-6)
    assert grads_s.keys() == grads.keys()
    for k in grads:
        torch.testing.assert_close(grads_s[k], grads[k], rtol=0, atol=1e-6)


def test_evaluation_and_small_batches_keep_the_full_logits(monkeypatch):
    monkeypatch.setattr(sliced, "SLICE_BYTES", SMALL_SLICES)
    model = make_model()
    x, y = make_batches(1, 2)[0]
    with torch.no_grad():  # evaluation reads the logits
        assert model(x, y).logits.shape == (*x.shape, TINY.vocab_size)
    assert model(x[:1, :5], y[:1, :5]).logits is not None  # 5 tokens: one slice, nothing to gain
    assert model(x, y).logits is None


def test_a_batch_of_only_ignored_targets_gives_nan_as_cross_entropy(monkeypatch):
    monkeypatch.setattr(sliced, "SLICE_BYTES", SMALL_SLICES)
    x, y = make_batches(1, 2)[0]
    assert torch.isnan(make_model()(x, torch.full_like(y, sliced.IGNORE_INDEX)).loss)


def _train(rank: int, world: int, slice_bytes: int, zero: dict) -> tuple[list[float], dict]:
    import zero_core

    sliced.SLICE_BYTES = slice_bytes
    micro = 2
    engine = zero_core.initialize(make_model(), ds_config(3, "fp32", micro, **zero))
    losses = train_local(engine, rank, world, micro, 3)
    state = engine.full_state_dict()
    engine.close()
    return losses, state


@pytest.mark.slow
@pytest.mark.parametrize(
    "zero",
    [{"stage3_param_persistence_threshold": 0}, {"offload_optimizer": {"device": "cpu"}}],
    ids=["units-released", "optimizer-offload"],
)
def test_stage3_trains_the_same_with_the_loss_in_slices(zero):
    plain = run_ranks(_train, 2, sliced.SLICE_BYTES, zero)
    in_slices = run_ranks(_train, 2, SMALL_SLICES, zero)
    assert in_slices[0] == pytest.approx(plain[0], rel=0, abs=1e-6)
    for k, v in plain[1].items():
        torch.testing.assert_close(in_slices[1][k], v, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_every_engine_trains_the_same_with_the_loss_in_slices(tmp_path):
    """ZBENCH_LOSS_SLICE_BYTES small enough that each rank's 4 x 16 tokens take 7 slices: DDP, zero_core stage 3
    and FSDP2 train to the losses they reach with one cross-entropy; a bad value is one Error line."""
    variants = [{"name": "ddp", "engine": "ddp"}, {"name": "zero3", "engine": "zero", "stage": 3},
                {"name": "fsdp2", "engine": "fsdp2"}]
    losses = {}
    for name, env in (("whole", {}), ("sliced", {"ZBENCH_LOSS_SLICE_BYTES": str(4 * 512 * 10)})):
        path = tiny_scenario(tmp_path, name, variants)
        proc = zbench("run", path, "--out", str(tmp_path / name), "--wandb", "off", env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (results,) = (tmp_path / name).glob("*/results.json")
        losses[name] = {v["variant"]: v["losses"] for v in json.loads(results.read_text())["variants"]}
        assert table(proc.stdout)["zero3"]["Loss parity vs DDP"].endswith(" ok")
    # a bad setting is one line before any launch, not a failure on every rank
    proc = zbench("run", path, "--out", str(tmp_path / "bad"), "--wandb", "off", "--variants", "zero3",
                  env={"ZBENCH_LOSS_SLICE_BYTES": "lots"})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        "Error: ZBENCH_LOSS_SLICE_BYTES must be a positive whole number of bytes, not 'lots'; unset it, or give a "
        f"size such as {sliced.SLICE_BYTES}"
    )
    assert not (tmp_path / "bad").exists()
    assert losses["sliced"].keys() == losses["whole"].keys() == {"ddp", "zero3", "fsdp2"}
    for variant, whole in losses["whole"].items():
        assert losses["sliced"][variant] == pytest.approx(whole, rel=0, abs=1e-5), variant


def test_a_slice_size_that_is_not_a_positive_number_is_refused(monkeypatch):
    monkeypatch.setenv("ZBENCH_LOSS_SLICE_BYTES", "1e6")
    with pytest.raises(ValueError, match="ZBENCH_LOSS_SLICE_BYTES must be a positive whole number of bytes"):
        sliced.tokens_per_slice(TINY.vocab_size)

"""`zero_core.deepspeed.utils.safe_get_full_fp32_param` / `safe_get_full_optimizer_state`: one parameter's whole
fp32 master and Adam moments, equal to the engine's full state dict and to rank 0's own run, at stages 1-3 on 2
gloo ranks; None for a parameter no engine trains (frozen, or another model's). Their writes,
`safe_set_full_fp32_param` / `safe_set_full_optimizer_state`: read back as written, nothing else moved, and the
next step trains from the written master (states on the device, the host and NVMe)."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks
from parity_workers import ds_config, ds_engine, make_batches, make_model

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier


def _reads(rank: int, world: int, stage: int, offload: bool) -> dict:
    from zero_core.deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    engine, model = ds_engine(stage, "bf16", offload)
    for x, y in make_batches(2, world):
        engine.backward(engine(x[rank : rank + 1], y[rank : rank + 1]).loss)
        engine.step()
    names = dict(model.named_parameters())
    out = {
        "full": engine.full_state_dict(),
        "master": {n: safe_get_full_fp32_param(p) for n, p in names.items()},
        "exp_avg": {n: safe_get_full_optimizer_state(p, "exp_avg") for n, p in names.items()},
        "exp_avg_sq": {n: safe_get_full_optimizer_state(p, "exp_avg_sq") for n, p in names.items()},
        "stranger": safe_get_full_fp32_param(torch.nn.Parameter(torch.zeros(3))),
    }
    try:
        safe_get_full_optimizer_state(next(iter(names.values())), "momentum_buffer")
    except ValueError as e:
        out["bad_key"] = str(e)
    engine.close()
    return out


@pytest.mark.parametrize("stage, offload", [(1, False), (2, True), (3, False), (3, True)])
def test_one_parameters_states_equal_the_engines(stage, offload):
    got = run_ranks(_reads, 2, stage, offload)
    frozen = "blocks.0.ln1.bias"  # make_model freezes it: no master, no moments
    assert got["master"][frozen] is None and got["exp_avg"][frozen] is None
    assert got["stranger"] is None
    assert "momentum_buffer" in got["bad_key"] and "\n" not in got["bad_key"]
    trained = [n for n in got["master"] if n != frozen]
    for name in trained:
        assert torch.equal(got["master"][name].cpu(), got["full"][name]), name
        assert got["exp_avg"][name].shape == got["full"][name].shape
    assert all(float(got["exp_avg_sq"][n].abs().sum()) > 0 for n in trained)  # two steps of squared gradients


def _writes(rank: int, world: int, stage: int, offload: str | None) -> dict:
    """At lr 0 (AdamW then leaves the master as it is): a step, the writes, another step; what the reads and
    the forward's weights then hold."""
    import zero_core.deepspeed as deepspeed
    from zero_core.deepspeed.utils import (safe_get_full_fp32_param, safe_get_full_optimizer_state,
                                           safe_set_full_fp32_param, safe_set_full_optimizer_state)

    where = {"device": "nvme", "nvme_path": offload} if offload and offload != "cpu" else {"device": offload}
    cfg = ds_config(stage, "bf16", 1, **({"offload_optimizer": where} if offload else {}))
    cfg["optimizer"]["params"]["lr"] = 0.0
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    batches = make_batches(2, world)
    target = model.blocks[1].attn.qkv.weight  # a parameter that spans both ranks' shards
    value = torch.linspace(-1, 1, target.numel()).view(target.shape)
    engine.backward(engine(batches[0][0][rank : rank + 1], batches[0][1][rank : rank + 1]).loss)
    engine.step()
    before = engine.full_state_dict()
    safe_set_full_fp32_param(target, value)
    safe_set_full_optimizer_state(target, value * 2, "exp_avg")
    safe_set_full_optimizer_state(target, value.abs() * 3, "exp_avg_sq")
    safe_set_full_fp32_param(torch.nn.Parameter(torch.zeros(3)), torch.ones(3))  # no engine's: left alone
    out = {"master": safe_get_full_fp32_param(target).cpu(), "value": value, "before": before,
           "exp_avg": safe_get_full_optimizer_state(target, "exp_avg").cpu(),
           "exp_avg_sq": safe_get_full_optimizer_state(target, "exp_avg_sq").cpu(), "after": engine.full_state_dict()}
    try:
        safe_set_full_fp32_param(target, value.t())
    except ValueError as e:
        out["bad_shape"] = str(e)
    engine.backward(engine(batches[1][0][rank : rank + 1], batches[1][1][rank : rank + 1]).loss)
    engine.step()
    with deepspeed.zero.GatheredParameters([target]):
        out["forward_weight"] = target.detach().float().cpu().clone()
    engine.close()
    return out


@pytest.mark.parametrize("stage, offload", [(1, None), (2, "cpu"), (3, None), (3, "cpu"), (3, "nvme")])
def test_written_states_are_read_back_and_the_next_step_trains_from_them(stage, offload, tmp_path):
    got = run_ranks(_writes, 2, stage, str(tmp_path) if offload == "nvme" else offload)
    value, name = got["value"], "blocks.1.attn.qkv.weight"
    assert torch.equal(got["master"], value) and torch.equal(got["after"][name], value)
    assert torch.equal(got["exp_avg"], value * 2) and torch.equal(got["exp_avg_sq"], value.abs() * 3)
    assert not torch.equal(got["before"][name], value)
    assert all(torch.equal(got["after"][k], v) for k, v in got["before"].items() if k != name)  # nothing else moved
    assert "shape" in got["bad_shape"] and "\n" not in got["bad_shape"]
    # the write changed the fp32 master only; the step after it (lr 0) put that master into the forward's weights
    assert torch.equal(got["forward_weight"], value.to(torch.bfloat16).float())


def _grads(rank: int, world: int, stage: int, offload: dict | None, gas: int) -> dict:
    """A step, then a window of `gas` micro-steps: safe_get_full_grad of every parameter after its last backward,
    against torch autograd of the same weights on every rank's micro-batches (the mean loss of the window)."""
    import zero_core.deepspeed as deepspeed
    from zero_core.deepspeed.utils import safe_get_full_grad

    cfg = ds_config(stage, "fp32", 1, gas=gas, clip=1e-3, **({"offload_optimizer": offload} if offload else {}))
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    batches = make_batches(2 * gas, world)
    for x, y in batches[:gas]:
        engine.backward(engine(x[rank : rank + 1], y[rank : rank + 1]).loss)
        engine.step()
    reference = make_model()
    reference.load_state_dict(engine.full_state_dict())
    out = {}
    for i, (x, y) in enumerate(batches[gas:]):
        engine.backward(engine(x[rank : rank + 1], y[rank : rank + 1]).loss)
        reference(x, y).loss.backward()  # every rank's sample: the mean over ranks
        if i < gas - 1:
            try:
                safe_get_full_grad(model.blocks[1].attn.qkv.weight)
            except ValueError as e:
                out["mid_window"] = str(e)
            engine.step()
    names = dict(model.named_parameters())
    out["got"] = {n: safe_get_full_grad(p) for n, p in names.items()}
    out["want"] = {n: p.grad / gas if p.grad is not None else None for n, p in reference.named_parameters()}
    stranger = torch.nn.Parameter(torch.zeros(2))
    stranger.grad = torch.ones(2)
    out["stranger"] = safe_get_full_grad(stranger)
    engine.step()
    try:
        safe_get_full_grad(model.blocks[1].attn.qkv.weight)
    except ValueError as e:
        out["after_step"] = str(e)
    engine.close()
    return out


@pytest.mark.parametrize(
    "stage, offload, gas",
    [(1, None, 1), (2, {"device": "cpu"}, 1), (2, {"device": "cpu"}, 2), (3, None, 2), (3, {"device": "cpu"}, 1),
     (2, {"device": "cpu", "ratio": 0.5}, 1)],
)
def test_full_gradient_is_the_windows_mean_gradient_before_clipping(stage, offload, gas):
    got = run_ranks(_grads, 2, stage, offload, gas)
    frozen = "blocks.0.ln1.bias"
    assert got["got"][frozen] is None and torch.equal(got["stranger"], torch.ones(2))
    for name, want in got["want"].items():
        if name != frozen:
            assert torch.allclose(got["got"][name].cpu(), want, rtol=1e-4, atol=1e-7), name
    assert float(sum(g.norm() ** 2 for g in got["want"].values() if g is not None)) > 1e-6  # clipping would engage
    for key in ("after_step",) + (("mid_window",) if gas > 1 and stage != 3 else ()):  # stage 3 answers mid-window
        assert "before step()" in got[key] and "\n" not in got[key]

"""`zero_core.deepspeed.utils.safe_get_full_fp32_param` / `safe_get_full_optimizer_state`: one parameter's whole
fp32 master and Adam moments, equal to the engine's full state dict and to rank 0's own run, at stages 1-3 on 2
gloo ranks; None for a parameter no engine trains (frozen, or another model's). Their writes,
`safe_set_full_fp32_param` / `safe_set_full_optimizer_state`: read back as written, nothing else moved, and the
next step trains from the written master (states on the device, the host and NVMe)."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks
from parity_workers import ds_config, make_batches, make_model

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier


def _reads(rank: int, world: int, stage: int, offload: bool) -> dict:
    import zero_core.deepspeed as deepspeed
    from zero_core.deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    zero = {"offload_optimizer": {"device": "cpu"}} if offload else {}
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds_config(stage, "bf16", 1, **zero))
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

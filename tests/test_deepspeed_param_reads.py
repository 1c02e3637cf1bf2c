"""`zero_core.deepspeed.utils.safe_get_full_fp32_param` / `safe_get_full_optimizer_state`: one parameter's whole
fp32 master and Adam moments, equal to the engine's full state dict and to rank 0's own run, at stages 1-3 on 2
gloo ranks; None for a parameter no engine trains (frozen, or another model's)."""

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

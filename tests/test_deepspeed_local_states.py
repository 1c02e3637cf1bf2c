"""`zero_core.deepspeed.utils.safe_get_local_*` / `safe_set_local_*`: this rank's share of one parameter's fp32
master, Adam moments and gradient, read and written without communication. On 2 gloo ranks at stages 1-3 (with
host offload at 2), the ranks' shares in rank order make up exactly what the full reads give; writing each rank's
share changes that share alone and the full read shows it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_harness import run_ranks
from parity_workers import ds_engine, make_batches

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier


def _locals(rank: int, world: int, stage: int, offload: bool) -> dict:
    from zero_core.deepspeed import utils as u

    engine, model = ds_engine(stage, "fp32", offload)
    (x0, y0), (x1, y1) = make_batches(2, world)
    engine.backward(engine(x0[rank : rank + 1], y0[rank : rank + 1]).loss)
    engine.step()
    engine.backward(engine(x1[rank : rank + 1], y1[rank : rank + 1]).loss)  # a window ends: gradients readable
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    mine = {n: {"master": u.safe_get_local_fp32_param(p).cpu(), "grad": u.safe_get_local_grad(p).cpu(),
                "exp_avg": u.safe_get_local_optimizer_state(p, "exp_avg").cpu(),
                "exp_avg_sq": u.safe_get_local_optimizer_state(p, "exp_avg_sq").cpu()} for n, p in params}
    full = {n: {"master": u.safe_get_full_fp32_param(p).cpu(), "grad": u.safe_get_full_grad(p).cpu(),
                "exp_avg": u.safe_get_full_optimizer_state(p, "exp_avg").cpu(),
                "exp_avg_sq": u.safe_get_full_optimizer_state(p, "exp_avg_sq").cpu()} for n, p in params}
    out = {"full": full, "stranger": u.safe_get_local_fp32_param(torch.nn.Parameter(torch.zeros(3)))}
    name, target = params[len(params) // 2]
    share = mine[name]["master"]
    u.safe_set_local_fp32_param(target, share * 2 + rank)
    u.safe_set_local_optimizer_state(target, torch.full_like(share, float(rank + 1)), "exp_avg")
    try:
        u.safe_set_local_fp32_param(target, torch.zeros(share.numel() + 1))
    except ValueError as e:
        out["bad_size"] = str(e)
    out["written"] = {"name": name, "master": u.safe_get_full_fp32_param(target).cpu(),
                      "exp_avg": u.safe_get_full_optimizer_state(target, "exp_avg").cpu()}
    every = [None] * world
    dist.all_gather_object(every, mine)
    out["shares"] = every
    engine.step()
    engine.close()
    return out


@pytest.mark.parametrize("stage, offload", [(1, False), (2, True), (3, False)])
def test_the_ranks_shares_make_up_the_full_states_and_write_only_themselves(stage, offload):
    got = run_ranks(_locals, 2, stage, offload)
    shares = got["shares"]
    split = 0
    for name, full in got["full"].items():
        for key, value in full.items():
            pieces = [s[name][key] for s in shares]
            assert all(p.dim() == 1 for p in pieces)
            assert torch.equal(torch.cat(pieces), value.reshape(-1)), (name, key)
        split += all(s[name]["master"].numel() for s in shares)
    assert split > 0  # some parameter is split between the ranks
    name, written = got["written"]["name"], got["written"]
    before = [s[name]["master"] for s in shares]
    assert torch.equal(written["master"].reshape(-1), torch.cat([b * 2 + r for r, b in enumerate(before)]))
    want = torch.cat([torch.full_like(b, float(r + 1)) for r, b in enumerate(before)])
    assert torch.equal(written["exp_avg"].reshape(-1), want)
    assert got["stranger"] is None and "elements" in got["bad_size"] and "\n" not in got["bad_size"]

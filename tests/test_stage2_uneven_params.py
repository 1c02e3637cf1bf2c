"""Ranks whose forward uses different parameters in a step (a branch one rank takes and another does not, an
expert only some ranks route to) complete different gradient buckets, or the same ones in another order. With
several buckets the reductions must still pair bucket with bucket across ranks: every stage's gradients equal
the average over ranks of each rank's own gradients, a parameter a rank did not use counting as zero there
(what DDP with `find_unused_parameters` averages). Here each bucket holds one layer (`reduce_bucket_size` =
one Linear(16, 16)), so a bucket paired with the wrong one on the peer gives wrong numbers of the right size."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from dist_harness import run_ranks

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier (-m 'not slow')

LAYER = 16 * 16 + 16  # one bucket per Linear(16, 16)
# which branches each rank's forward takes, per micro-step (cycled): rank 0's, rank 1's
PATTERNS = {
    "split": [("a", "b")],
    "mixed": [("a", "b"), ("ab", ""), ("b", "ab"), ("ab", "ab"), ("", "a")],
}


class Branchy(torch.nn.Module):
    """trunk -> branch a and/or b (or neither) -> head; `wide` makes b two layers of another size."""

    def __init__(self, wide: bool = False, head_first: bool = False) -> None:
        super().__init__()
        if head_first:  # registered first, used last: its bucket completes first in backward
            self.head = torch.nn.Linear(16, 16)
        self.trunk = torch.nn.Linear(16, 16)
        self.a = torch.nn.Linear(16, 16)
        self.b = (torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 16)) if wide
                  else torch.nn.Linear(16, 16))
        if not head_first:
            self.head = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, branches: str = "ab") -> torch.Tensor:
        h = torch.tanh(self.trunk(x))
        out = h
        for name in branches:
            out = out + getattr(self, name)(h)
        return self.head(torch.tanh(out))


class Blocks(torch.nn.Module):
    """Both branches inside each block (the units stage 3 gathers): an MoE layer's experts."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Linear(16, 16)
        self.blocks = torch.nn.ModuleList(Branchy() for _ in range(2))
        self.head = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, branches: str = "ab") -> torch.Tensor:
        h = self.trunk(x)
        for block in self.blocks:
            h = block(h, branches)
        return self.head(h)


def _config(stage: int, gas: int) -> dict:
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": LAYER,
                                  "stage3_param_persistence_threshold": 10**5},  # stage 3: no gathers in backward
            "zero_core": {"comm_timeout_s": 60}}  # a collective mismatch fails the test instead of hanging it


def _batch(rank: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * i + rank)
    return torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)


def _worst_error(rank: int, world: int, stage: int, model_kind: str, pattern: str, gas: int, steps: int) -> float:
    """Largest difference between the engine's gradients and the reference average, over `steps` steps."""
    import zero_core
    from zero_core.deepspeed.utils import safe_get_full_grad

    torch.manual_seed(0)
    model = Blocks() if model_kind == "blocks" else Branchy(wide=model_kind == "wide")
    ref = copy.deepcopy(model)
    engine = zero_core.initialize(model, _config(stage, gas))
    table, worst = PATTERNS[pattern], 0.0
    for step in range(steps):
        ref.zero_grad(set_to_none=True)
        for micro in range(gas):
            i = step * gas + micro
            for r in range(world):  # every rank's loss, on one process: the average DDP takes
                x, y = _batch(r, i)
                (torch.nn.functional.mse_loss(ref(x, table[i % len(table)][r]), y) / (world * gas)).backward()
            x, y = _batch(rank, i)
            out = engine(x.to(engine.device), table[i % len(table)][rank])
            engine.backward(torch.nn.functional.mse_loss(out, y.to(engine.device)))
            if micro < gas - 1:
                engine.step()  # counts the micro-step; the window's last one updates below
        for (name, p), q in zip(engine.module.named_parameters(), ref.parameters()):
            got = safe_get_full_grad(p)
            want = q.grad if q.grad is not None else torch.zeros_like(q)
            worst = max(worst, float((got.cpu() - want).abs().max()))
        engine.step()
        # both go on from the engine's updated weights
        ref.load_state_dict({k: v.cpu() for k, v in engine.full_state_dict().items()})
    engine.close()
    return worst


def _cases(rank: int, world: int, cases: list[tuple]) -> list[float]:
    return [_worst_error(rank, world, *case) for case in cases]


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_ranks_using_different_parameters_get_the_averaged_gradients(stage):
    cases = [(stage, kind, pattern, gas, 3) for kind in ("same", "wide") for pattern in PATTERNS for gas in (1, 2)]
    errors = run_ranks(_cases, 2, cases)
    assert all(e < 1e-6 for e in errors), dict(zip(cases, errors))


def test_stage3_branches_inside_one_unit_get_the_averaged_gradients():
    """Stage 3 gathers weights per unit: ranks that run the same units (the branches inside each block) but not
    the same parameters, with units that stay gathered through backward (under the persistence threshold, as
    these are), still pair their gradient reductions."""
    cases = [(3, "blocks", pattern, gas, 3) for pattern in PATTERNS for gas in (1, 2)]
    errors = run_ranks(_cases, 2, cases)
    assert all(e < 1e-6 for e in errors), dict(zip(cases, errors))


def _train(rank: int, world: int, stage: int, offload: bool, overlap: bool) -> dict:
    """Train with nothing read between steps: the next forward is the first to need the updated weights."""
    import zero_core

    torch.manual_seed(0)
    config = _config(stage, 1)
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    config["zero_core"]["overlap_weight_gather"] = overlap
    engine = zero_core.initialize(Branchy(), config)
    table = PATTERNS["mixed"]
    for i in range(6):
        x, y = _batch(rank, i)
        out = engine(x.to(engine.device), table[i % len(table)][rank])
        engine.backward(torch.nn.functional.mse_loss(out, y.to(engine.device)))
        engine.step()
    state = {k: v.clone() for k, v in engine.full_state_dict().items()}
    engine.close()
    return state


def _trains(rank: int, world: int, runs: list[tuple]) -> list[dict]:
    return [_train(rank, world, *run) for run in runs]


@pytest.mark.parametrize("stage", [1, 2])
def test_weight_gathers_overlapped_with_the_forward_pair_up_across_ranks(stage):
    """With `overlap_weight_gather` each forward waits for the buckets its modules read; with optimizer offload
    that wait is where the bucket is all-gathered, so ranks reading different buckets must still gather the
    same ones in the same order: the weights equal those of the run that gathers everything after the step."""
    runs = [(stage, offload, overlap) for offload in (False, True) for overlap in (False, True)]
    after, overlapped, after_offload, overlapped_offload = run_ranks(_trains, 2, runs)
    for k, v in after.items():
        assert torch.equal(overlapped[k], v), k
        assert torch.equal(overlapped_offload[k], after_offload[k]), ("offload", k)


def _reduction_events(rank: int, world: int) -> dict:
    """Every rank uses every parameter; the head's bucket is first in the layout and completes first."""
    import zero_core
    from zero_core.stages.grad_buckets import GradReducer

    torch.manual_seed(0)
    engine = zero_core.initialize(Branchy(head_first=True), _config(2, 1))
    red: GradReducer = engine.reducer
    events: list[tuple[str, int]] = []
    complete, reduce = red._complete, red._reduce
    red._complete = lambda g: (events.append(("complete", g)), complete(g))[1]
    red._reduce = lambda g: (events.append(("reduce", g)), reduce(g))[1]
    passes = []
    for i in range(3):
        events.clear()
        x, y = _batch(rank, i)
        engine.backward(torch.nn.functional.mse_loss(engine(x.to(engine.device)), y.to(engine.device)))
        engine.step()
        passes.append(list(events))
    orders = [None] * world
    dist.all_gather_object(orders, red.order)
    engine.close()
    return {"passes": passes, "orders": orders, "groups": len(engine.layout.groups)}


def test_once_the_order_is_agreed_each_bucket_is_reduced_as_it_completes():
    """The order the ranks agree on is the one buckets complete in when every rank uses every parameter: from
    the second backward on, no bucket waits for another."""
    out = run_ranks(_reduction_events, 2)
    assert out["orders"][0] == out["orders"][1]
    assert sorted(out["orders"][0]) == list(range(out["groups"]))
    first, *later = out["passes"]
    assert first[0] == ("complete", 0) and ("reduce", 0) not in first[:2]  # layout order: the head waited
    for events in later:
        assert len(events) == 2 * out["groups"]
        for done, red in zip(events[::2], events[1::2]):
            assert done[0] == "complete" and red == ("reduce", done[1]), events

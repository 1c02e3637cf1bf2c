"""Stage 3 with `stage3_max_reuse_distance: 0` (no prefetch, nothing persistent), where a block is released as soon
as its forward returns, and a parameter of that block read outside the block's forward.

Read inside a forward (the parent's, by attribute or through `parameters()`, or a later module's), the block is
gathered again for the read: the losses are DeepSpeed 0.19.8's for the same script (CPU, one rank; numbers below)
and the weights stage 2's, on one rank and on two. Read outside the forward and backward (after the step), its
metadata still answers and any read of its values is refused in one line naming it. Each case runs in a forked
rank (dist_harness.run_ranks): a crash fails the test instead of ending pytest."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from dist_harness import run_ranks
from torch import nn

# DeepSpeed 0.19.8, DS_ACCELERATOR=cpu, one rank over gloo, running `_train`'s model, config and batches at stage 3
# with stage3_max_reuse_distance 0 (the same with its default): the loss of each of 3 steps
DEEPSPEED_LOSSES = {
    "parent": [0.002277286723256111, 0.018848510459065437, 0.09321277588605881],
    "matmul": [0.029026281088590622, 0.006569684483110905, 0.0018456348916515708],
    "later": [0.0534667931497097, 0.03568951413035393, 0.07263244688510895],
}


class _Reader(nn.Linear):
    """A module after the blocks whose forward reads block 0's bias (held as a plain attribute, not a child)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y + self.src.bias if self.mode == "later" else y


class _Net(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.out = _Reader(8, 1)
        object.__setattr__(self.out, "src", self.blocks[0])
        object.__setattr__(self.out, "mode", mode)
        if mode == "registered":  # DeepSpeed's form of the parent's read: declared, then read as "parent" does
            from zero_core.deepspeed.zero import register_external_parameter

            register_external_parameter(self, self.blocks[0].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = torch.tanh(b(x))
        if self.mode in ("parent", "registered"):
            x = x + self.blocks[0].bias  # block 0 has been released by now
        elif self.mode == "matmul":
            x = x @ self.blocks[0].weight  # autograd keeps the weight for the backward
        elif self.mode == "iterate":
            x = x + 0.1 * torch.stack([p.mean() for p in self.blocks[0].parameters()]).sum()
        return self.out(x).pow(2).mean()


def _engine(stage: int, mode: str):
    import zero_core.deepspeed as deepspeed

    zero = {"stage": stage}
    if stage == 3:
        zero |= {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0,
                 "stage3_param_persistence_threshold": 0}
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
    torch.manual_seed(0)
    model = _Net(mode)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine, model


def _held(engine) -> int:
    return sum(b.untyped_storage().size() > 0 for b in engine.strategy.gatherer.full)


def _train(rank: int, world: int, mode: str) -> dict:
    """3 steps at stage 3 and at stage 2, each rank on its share of the same batches; then a forward without grad."""
    out = {}
    for stage in (3, 2):
        engine, model = _engine(stage, mode)
        torch.manual_seed(1)
        losses, held = [], []
        for _ in range(3):
            x = torch.randn(2 * world, 8)[2 * rank : 2 * rank + 2]
            loss = engine(x.to(engine.device))
            engine.backward(loss)
            held.append(_held(engine) if stage == 3 else 0)
            engine.step()
            losses.append(loss.item())
        with torch.no_grad():
            evaluated = engine(torch.ones(2, 8, device=engine.device)).item()
        out[stage] = {"losses": losses, "weights": engine.full_state_dict(), "eval": evaluated,
                      "held": held + [_held(engine) if stage == 3 else 0]}
    return out


def _refusals(rank: int, world: int) -> dict:
    """After a step: what a released parameter answers outside the forward, then a step more."""
    from zero_core.deepspeed.zero import GatheredParameters

    engine, model = _engine(3, "parent")
    engine.backward(engine(torch.ones(2, 8, device=engine.device)))
    engine.step()
    p = model.blocks[0].bias
    meta = (tuple(p.shape), p.numel(), p.dtype, p.requires_grad, p.grad, tuple(torch.zeros_like(p).shape))
    model.to(engine.device)  # changes nothing: allowed
    refused = {}
    reads = {"sum": lambda: p.sum(), "add": lambda: torch.ones(8) + p, "repr": lambda: repr(p),
             "detach": lambda: p.detach(), "data": lambda: p.data, "deepcopy": lambda: copy.deepcopy(model),
             "iterate": lambda: [q.norm() for q in model.parameters()]}
    for what, read in reads.items():
        try:
            read()
            refused[what] = None
        except ValueError as e:
            refused[what] = str(e)
    with GatheredParameters([p]):
        gathered = p.detach().clone()
    full = engine.full_state_dict()
    loss = engine(torch.ones(2, 8, device=engine.device))  # the engine trains on
    engine.backward(loss)
    engine.step()
    return {"meta": meta, "refused": refused, "gathered": gathered, "full": full, "loss": loss.item(),
            "held": _held(engine)}


def _agree(got: dict) -> None:
    s3, s2 = got[3], got[2]
    assert s3["held"] == [0, 0, 0, 0]  # each backward gave back what the forward read; nothing held after
    assert s3["losses"] == pytest.approx(s2["losses"], abs=1e-6)
    assert s3["eval"] == pytest.approx(s2["eval"], abs=1e-6)
    for name, value in s2["weights"].items():
        assert torch.allclose(s3["weights"][name], value, atol=1e-6), name


@pytest.mark.parametrize("mode", ["parent", "matmul", "later", "registered"])
def test_forward_reads_of_a_released_block_train_as_deepspeed(mode):
    got = run_ranks(_train, 1, mode)
    assert got[3]["losses"] == pytest.approx(DEEPSPEED_LOSSES["parent" if mode == "registered" else mode], abs=1e-6)
    _agree(got)


@pytest.mark.parametrize("call", ["register_external_parameter", "unregister_external_parameter"])
def test_external_parameter_calls_check_their_arguments(call):
    from zero_core.deepspeed import zero

    lin = nn.Linear(2, 2)
    getattr(zero, call)(lin, lin.weight)  # nothing to register: any forward's read is gathered
    with pytest.raises(ValueError, match=f"deepspeed.zero.{call}: the second argument must be a torch.nn.Parameter"):
        getattr(zero, call)(lin, "weight")
    with pytest.raises(ValueError, match="the first argument must be a torch.nn.Module, not Parameter"):
        getattr(zero, call)(lin.weight, lin.weight)


def test_forward_reads_through_parameters_train_as_stage_2():
    """DeepSpeed 0.19.8 fails here (its released parameters are empty: MeanBackward0 returns a gradient of
    shape [0]); the same gathering makes it right."""
    _agree(run_ranks(_train, 1, "iterate"))


def test_reads_after_the_step_refused_in_one_line_metadata_answers():
    got = run_ranks(_refusals, 1)
    assert got["meta"] == ((8,), 8, torch.float32, True, None, (8,))
    for what, message in got["refused"].items():
        assert message is not None, what  # a ValueError, not a crash nor a value
        assert re.match(r"(blocks\.\d|out)\.(weight|bias) was read ", message), (what, message)
        assert "GatheredParameters" in message and "\n" not in message, (what, message)
    assert got["refused"]["sum"].startswith("blocks.0.bias was read (sum) at ZeRO stage 3 outside the model's forward")
    assert got["refused"]["data"].startswith("blocks.0.bias was read (.data) ")
    assert torch.equal(got["gathered"].cpu(), got["full"]["blocks.0.bias"].cpu())
    assert got["held"] == 0 and got["loss"] == pytest.approx(got["loss"])  # finite


def test_two_ranks_gather_the_read_block_together():
    """On two ranks the read gathers the block's shards from both (collective: both run the forward)."""
    _agree(run_ranks(_train, 2, "parent"))

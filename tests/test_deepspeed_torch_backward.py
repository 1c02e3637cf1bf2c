"""DeepSpeed 0.19's torch-style backward on `zero_core.deepspeed`: `engine.scale(loss).backward()` or a plain
`loss.backward()` on what the engine returned, then `engine.step()`, trains as `engine.backward(loss)` does, at
every stage, with gradient accumulation, for a model that returns its loss and the logits it came from."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks

# DeepSpeed 0.19.8 on CPU, 2 ranks, fp32, _train below with engine.backward (stages 1-3 alike) and, at stage 3,
# with loss.backward() and engine.scale(loss).backward() too: the losses, the gradient norm of each update, and
# the second layer's bias after the second update. (DeepSpeed's stages 1-2 divide a plain loss.backward()'s
# gradients by the accumulation steps twice for this model, once at each returned tensor: its norms there are
# these over 3.)
DS_LOSSES = [1.6446641683578491, 0.529573380947113, 0.6684616804122925, 0.17237694561481476, 1.61904776096344,
             1.0742582082748413]
DS_NORMS = [0.7119398188085945, 0.5938461026005862]
DS_BIAS = [0.07211807370185852, 0.04624908044934273, 0.013666179031133652, -0.06914649158716202]


class TwoOutputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        logits = self.b(torch.tanh(self.a(x)))
        return {"loss": torch.nn.functional.mse_loss(logits, y), "logits": logits}


def _train(rank: int, world: int, stage: int, how: str) -> tuple:
    import zero_core.deepspeed as deepspeed

    torch.manual_seed(0)
    model = TwoOutputs()
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "gradient_clipping": 0.3,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01, "torch_adam": True}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    g = torch.Generator().manual_seed(5)
    losses, norms = [], []
    for i in range(6):
        xs, ys = torch.randn(2 * world, 8, generator=g), torch.randn(2 * world, 4, generator=g)
        loss = engine(xs[2 * rank:2 * rank + 2], ys[2 * rank:2 * rank + 2])["loss"]
        if how == "engine":
            engine.backward(loss)
        elif how == "torch":
            loss.backward()
        else:
            engine.scale(loss).backward()
        engine.step()
        losses.append(loss.item())
        if i % 3 == 2:
            norm = engine.get_global_grad_norm()
            norms.append(None if norm is None else float(norm))
    bias = deepspeed.utils.safe_get_full_fp32_param(model.b.bias).tolist()
    engine.close()
    return losses, norms, bias


def _all_ways(rank: int, world: int, stage: int) -> dict:
    return {how: _train(rank, world, stage, how) for how in ("engine", "torch", "scale")}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_torch_style_backward_trains_as_engine_backward_and_deepspeed(stage):
    runs = run_ranks(_all_ways, 2, stage)
    for how, (losses, norms, bias) in runs.items():
        assert losses == pytest.approx(DS_LOSSES, abs=1e-6), how
        assert bias == pytest.approx(DS_BIAS, abs=1e-6), how
        if stage > 0:  # stage 0 in fp32 keeps no norm, as DeepSpeed's
            assert norms == pytest.approx(DS_NORMS, abs=1e-6), how


def test_scale_takes_a_scalar_loss_with_a_graph():
    import zero_core.deepspeed as deepspeed

    model = TwoOutputs()
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    out = engine(torch.randn(2, 8), torch.randn(2, 4))
    assert torch.equal(engine.scale(out["loss"]), out["loss"])  # fp32: the loss scale is 1
    with pytest.raises(ValueError, match="scalar loss"):
        engine.scale(out["logits"])
    with pytest.raises(ValueError, match="scalar loss"):
        engine.scale(out["loss"].detach())
    engine.close()


class Checkpointed(TwoOutputs):
    """The second layer under a reentrant activation checkpoint: its gradients come from a nested backward."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        hidden = torch.tanh(self.a(x))
        logits = torch.utils.checkpoint.checkpoint(self.b, hidden, use_reentrant=True)
        return {"loss": torch.nn.functional.mse_loss(logits, y), "logits": logits}


def _engine_and_torch_backward(model_class: type, stage: int, build) -> dict:
    """Four steps (accumulating 2) through engine.backward and through a plain loss.backward(), from one seed:
    each way's gradient norm and full weights."""
    runs = {}
    for how in ("engine", "torch"):
        torch.manual_seed(0)
        model = model_class()
        cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
               "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": stage}}
        engine = build(model, cfg)
        g = torch.Generator().manual_seed(5)
        for _ in range(4):
            loss = engine(torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g))["loss"]
            engine.backward(loss) if how == "engine" else loss.backward()
            engine.step()
        norm = engine.get_global_grad_norm()
        runs[how] = (None if norm is None else float(norm), engine.full_state_dict())
        engine.close()
    return runs


@pytest.mark.parametrize("stage", [1, 3])
def test_a_reentrant_checkpoints_gradients_are_divided_too(stage):
    import zero_core.deepspeed as deepspeed

    def build(model, cfg):
        return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]

    runs = _engine_and_torch_backward(Checkpointed, stage, build)
    assert runs["torch"][0] == runs["engine"][0]  # gas 2 divides exactly
    assert all(torch.equal(v, runs["engine"][1][k]) for k, v in runs["torch"][1].items())


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_zero_core_initialize_takes_a_plain_loss_backward_too(stage):
    """zero_core's own `initialize` hands out an engine a plain `loss.backward()` trains, as DeepSpeed's does:
    without the hooks on its outputs the step would update from no gradients."""
    import zero_core

    runs = _engine_and_torch_backward(TwoOutputs, stage, zero_core.initialize)
    torch.manual_seed(0)
    assert not torch.equal(runs["engine"][1]["b.bias"], TwoOutputs().b.bias.detach())  # the updates moved it
    assert all(torch.equal(v, runs["engine"][1][k]) for k, v in runs["torch"][1].items())

"""Parameter groups, client optimizers and schedules at engine level, on 2 gloo ranks against plain torch on
one process with the full batch: per-group lr / weight decay / betas / eps at every stage and with optimizer
offload; a torch SGD run as it is on the shards, resumed on another world size; a torch scheduler that must
not advance on skipped fp16 steps."""

from __future__ import annotations

import pytest
import torch

import zero_core
from dist_harness import run_ranks
from parity_workers import make_batches, make_model

pytestmark = pytest.mark.slow  # spawned ranks or whole runs: outside the fast tier (-m 'not slow')

GLOBAL, STEPS = 4, 5


def _groups(model: torch.nn.Module) -> list[dict]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in named if p.dim() >= 2], "lr": 2e-2, "weight_decay": 0.1, "betas": (0.8, 0.99)},
        {"params": [p for n, p in named if p.dim() < 2], "lr": 5e-3, "weight_decay": 0.0, "eps": 1e-6},
    ]


def _config(stage: int, world: int, offload: bool = False) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": GLOBAL // world,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 400},
    }
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    return cfg


def _train(engine, rank: int, world: int, steps: range) -> list[float]:
    losses, micro = [], GLOBAL // world
    for s in steps:
        x, y = make_batches(STEPS + 3, GLOBAL)[s]
        loss = engine(x[rank * micro : (rank + 1) * micro], y[rank * micro : (rank + 1) * micro]).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def _torch_reference(make_opt) -> dict[str, torch.Tensor]:
    model = make_model()
    opt = make_opt(model)
    for s in range(STEPS):
        x, y = make_batches(STEPS + 3, GLOBAL)[s]
        opt.zero_grad()
        model(x, y).loss.backward()
        opt.step()
    return {k: v.float() for k, v in model.state_dict().items()}


def _grouped(rank: int, world: int, stage: int, offload: bool) -> dict:
    model = make_model()
    engine = zero_core.initialize(model, _config(stage, world, offload), model_parameters=_groups(model))
    _train(engine, rank, world, range(STEPS))
    return engine.full_state_dict()


@pytest.mark.parametrize("stage,offload", [(0, False), (1, False), (2, False), (3, False), (2, True), (3, True)])
def test_per_group_hyper_parameters_match_torch_adamw(stage, offload):
    got = run_ranks(_grouped, 2, stage, offload)
    want = _torch_reference(lambda m: torch.optim.AdamW(_groups(m), lr=1e-3))
    assert max(float((got[k] - want[k]).abs().max()) for k in want) < 1e-5


def test_groups_that_are_not_the_models_parameters_are_refused():
    model = make_model()
    other = torch.nn.Linear(3, 3)
    with pytest.raises(zero_core.ConfigError, match="not a parameter of the model"):
        zero_core.initialize(model, _config(2, 1), model_parameters=[{"params": list(other.parameters())}])
    model = make_model()
    with pytest.raises(zero_core.ConfigError, match="trainable but in no parameter group"):
        zero_core.initialize(model, _config(2, 1), model_parameters=[{"params": [model.wte.weight]}])


def _sgd(rank: int, world: int, stage: int, ckpt: str, phase: str) -> dict:
    model = make_model()
    cfg = {k: v for k, v in _config(stage, world).items() if k != "optimizer"}  # the client optimizer instead
    engine = zero_core.initialize(
        model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    )
    if phase == "a":
        _train(engine, rank, world, range(3))
        engine.save_checkpoint(ckpt)
    else:
        engine.load_checkpoint(ckpt)
        _train(engine, rank, world, range(3, STEPS))
    return engine.full_state_dict()


@pytest.mark.parametrize("stage", [2, 3])
def test_a_torch_sgd_runs_on_the_shards_and_resumes_on_another_world_size(tmp_path, stage):
    run_ranks(_sgd, 2, stage, str(tmp_path), "a")
    got = run_ranks(_sgd, 1, stage, str(tmp_path), "b")  # momentum buffers resharded from 2 ranks to 1
    want = _torch_reference(lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True))
    assert max(float((got[k] - want[k]).abs().max()) for k in want) < 1e-5


def test_a_client_optimizer_with_offload_is_refused_in_one_line():
    model = make_model()
    with pytest.raises(zero_core.ConfigError, match="optimizer offload updates on the host with AdamW/Adam only"):
        zero_core.initialize(
            model,
            {k: v for k, v in _config(2, 1, offload=True).items() if k != "optimizer"},
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        )


def test_a_torch_scheduler_does_not_advance_on_skipped_fp16_steps():
    """fp16 with a tiny model and an absurd initial loss scale: the first updates overflow and are skipped;
    the LambdaLR must see only applied updates, as DeepSpeed steps it."""
    model = make_model()
    cfg = {**_config(2, 1), "fp16": {"enabled": True, "initial_scale_power": 20, "hysteresis": 1}}
    seen: list[int] = []

    def factor(step: int) -> float:
        seen.append(step)
        return 1.0 / (1 + step)

    engine = zero_core.initialize(model, cfg, lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, factor))
    _train(engine, 0, 1, range(STEPS))
    applied = STEPS - engine.skipped_steps
    assert engine.skipped_steps > 0 and applied > 0
    assert engine.get_lr()[0] == pytest.approx(1e-3 / (1 + applied))  # reading it brings the scheduler up to date
    assert max(seen) == applied  # stepped once per applied update (the constructor's step 0 included), never more


def test_an_optimizer_not_known_to_be_element_wise_needs_the_untested_flag():
    class TrustRatio(torch.optim.SGD):  # stands for Lamb-like updates that read whole-tensor norms
        pass

    model = make_model()
    cfg = {k: v for k, v in _config(2, 1).items() if k != "optimizer"}
    with pytest.raises(zero_core.ConfigError, match="zero_allow_untested_optimizer"):
        zero_core.initialize(model, cfg, optimizer=TrustRatio(model.parameters(), lr=0.1))
    other = make_model()
    engine = zero_core.initialize(
        other, {**cfg, "zero_allow_untested_optimizer": True}, optimizer=TrustRatio(other.parameters(), lr=0.1)
    )
    assert type(engine.optimizer.client) is TrustRatio

"""Stage 0 in fp32 steps the model's own weights, as DeepSpeed's stage 0 (a torch optimizer over the module's
parameters): weights a script changes in place after `initialize` (`load_state_dict` of pretrained weights, a
`clamp_` under no_grad) are where the next update starts, and what a checkpoint saves. In bf16 the fp32 masters stay
the truth, as DeepSpeed's mixed-precision optimizer keeps them."""

from __future__ import annotations

import torch

import zero_core.deepspeed as deepspeed

_CONFIG = {"train_micro_batch_size_per_gpu": 4,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01}}}


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(7)
    return [(torch.randn(4, 6), torch.randn(4, 1)) for _ in range(3)]


def _engine(model: torch.nn.Module, **extra):
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={**_CONFIG, **extra})
    return engine


def _edit(module: torch.nn.Module, pretrained: dict[str, torch.Tensor]) -> None:
    module.load_state_dict(pretrained)  # in place, into the parameters' storage
    with torch.no_grad():
        module[0].weight.clamp_(-0.2, 0.2)


def _train(engine, batches) -> None:
    for x, y in batches:
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()


def test_weights_changed_in_place_after_initialize_are_where_the_fp32_update_starts():
    """As if the model had those weights when it was handed to initialize."""
    pretrained = _model(1).state_dict()
    edited_after = _engine(_model(0))
    _edit(edited_after.module, pretrained)
    before = _model(0)
    _edit(before, pretrained)
    edited_before = _engine(before)
    for engine in (edited_after, edited_before):
        _train(engine, _batches())
    assert all(torch.equal(a, b) for a, b in zip(edited_after.module.parameters(), edited_before.module.parameters()))
    edited_after.close()
    edited_before.close()


def test_a_weight_set_between_steps_is_where_the_next_fp32_update_starts():
    engine = _engine(_model(0))
    _train(engine, _batches()[:1])
    with torch.no_grad():
        engine.module[2].bias.data.fill_(3.0)  # through `.data`, as many scripts write
    _train(engine, _batches()[1:2])
    assert abs(engine.module[2].bias.item() - 3.0) < 0.1  # one AdamW step (lr 0.05) away from it
    engine.close()


def test_a_checkpoint_saves_the_edited_fp32_weights_before_any_step(tmp_path):
    pretrained = _model(1).state_dict()
    engine = _engine(_model(0))
    _edit(engine.module, pretrained)
    expected = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    engine.save_checkpoint(tmp_path)
    engine.close()
    fresh = _engine(_model(0))
    fresh.load_checkpoint(tmp_path)
    assert all(torch.equal(fresh.module.state_dict()[k], v) for k, v in expected.items())
    fresh.close()


def test_bf16_keeps_its_fp32_masters_as_deepspeeds_mixed_precision_optimizer_does():
    untouched, edited = _engine(_model(0), bf16={"enabled": True}), _engine(_model(0), bf16={"enabled": True})
    x, y = _batches()[0]
    for engine in (untouched, edited):
        engine.backward(torch.nn.functional.mse_loss(engine(x.bfloat16()).float(), y))
    _edit(edited.module, _model(1).state_dict())  # after the backward: both steps take the same gradients
    for engine in (untouched, edited):
        engine.step()
    assert all(torch.equal(a, b) for a, b in zip(untouched.module.parameters(), edited.module.parameters()))
    untouched.close()
    edited.close()

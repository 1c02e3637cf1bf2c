"""A training loop without a scheduler that sets the lr itself (`for g in optimizer.param_groups: g["lr"] = lr`,
as nanoGPT and many DeepSpeed scripts do) has it applied from the next step on, as DeepSpeed's optimizer does;
host updates started during backward with the old lr are redone exactly."""

from __future__ import annotations

import math

import pytest
import torch
from parity_workers import ds_config, make_batches, make_model

from zero_core import deepspeed

STEPS = 4


def cosine(step: int) -> float:
    return 2e-3 * 0.5 * (1 + math.cos(math.pi * step / STEPS))  # from twice the config's lr (1e-3) down


def _train(offload: bool, overlap: float = 0.0, write=None, scheduler=None, steps: int = STEPS,
           engine_groups: bool = False, clip: float = 1.0, speculated: list | None = None) -> tuple:
    """`steps` steps; `write(optimizer, step)` runs between backward and step. The state, and get_lr() before each
    step; `speculated` collects how many ranges each backward updated ahead of its step."""
    extra = {"offload_optimizer": {"device": "cpu"}} if offload else {}
    cfg = ds_config(2, "fp32", 2, clip=clip, **extra)
    cfg["zero_core"] = {"overlap_host_update": overlap} if offload else {}
    model = make_model()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                                                   lr_scheduler=scheduler)
    lrs = []
    for step, (x, y) in enumerate(make_batches(STEPS, 2)[:steps]):
        engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
        if speculated is not None:
            speculated.append(len(engine.optimizer.speculative.ranges))
        if engine_groups:  # set through engine.optimizer instead of the returned optimizer
            assert engine.optimizer.param_groups is optimizer.param_groups
            _set(engine.optimizer, step)
        if write is not None:
            write(optimizer, step)
        lrs.append(engine.get_lr()[0])
        engine.step()
    state = engine.full_state_dict()
    engine.close()
    return state, lrs


def _set(optimizer, step: int) -> None:
    for group in optimizer.param_groups:
        group["lr"] = cosine(step)


@pytest.mark.parametrize("offload, overlap", [(False, 0.0), (True, 0.0), (True, 1.0)])
def test_lrs_written_by_the_loop_equal_the_same_schedule_passed_to_initialize(offload, overlap):
    written, written_lrs = _train(offload, overlap, write=_set)
    scheduled, scheduled_lrs = _train(offload, 0.0, scheduler=cosine)  # `lambda step: lr`, DeepSpeed's form
    assert written_lrs == scheduled_lrs == [cosine(s) for s in range(STEPS)]
    for k, v in scheduled.items():
        assert torch.equal(written[k], v), k
    untouched, _ = _train(offload, overlap)  # and the writes did change the training
    assert any(not torch.equal(untouched[k], v) for k, v in written.items())


def test_an_lr_of_zero_written_after_the_first_step_freezes_the_weights():
    def zero_after_first(optimizer, step):
        if step >= 1:
            for group in optimizer.param_groups:
                group["lr"] = 0.0

    frozen, lrs = _train(True, 1.0, write=zero_after_first)
    one_step, _ = _train(True, 1.0, steps=1)
    assert lrs[1:] == [0.0] * (STEPS - 1)
    for k, v in one_step.items():  # AdamW at lr 0 moves nothing, weight decay included
        assert torch.equal(frozen[k], v), k


@pytest.mark.parametrize("value", [float("nan"), -1.0, "fast"])
def test_a_bad_lr_written_is_one_line_naming_the_group(value):
    def bad(optimizer, step):
        optimizer.param_groups[0]["lr"] = value

    with pytest.raises(ValueError) as e:
        _train(False, write=bad)
    assert "param_groups[0]['lr']" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("offload", [False, True])
def test_engine_optimizer_param_groups_are_the_handed_back_optimizers(offload):
    """DeepSpeed scripts log and set `engine.optimizer.param_groups[0]["lr"]`: the same groups as the
    optimizer initialize returned, so a write there applies too."""
    through_engine, lrs = _train(offload, write=lambda optimizer, step: None, engine_groups=True)
    through_returned, _ = _train(offload, write=_set)
    assert lrs == [cosine(s) for s in range(STEPS)]
    for k, v in through_returned.items():
        assert torch.equal(through_engine[k], v), k


def test_get_lr_without_a_schedule_is_the_configs_lr_exactly():
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(2, "bf16", 2))
    assert engine.get_lr() == [1e-3]  # as DeepSpeed reports it: the group's float, not a float32 copy
    engine.close()


def test_updates_speculated_at_the_old_lr_are_redone_at_the_written_one(backward_outlasts_host_folds):
    """Without clipping every backward's host updates are kept at the step, unless the loop set another lr
    between backward and step: those are redone at the new lr, so the run equals the schedule passed in."""
    speculated = []
    written, _ = _train(True, 1.0, write=_set, clip=0.0, speculated=speculated)
    scheduled, _ = _train(True, 0.0, scheduler=cosine, clip=0.0)
    assert speculated[0] > 0  # the first backward ran at the config's lr, before the loop's first write
    for k, v in scheduled.items():
        assert torch.equal(written[k], v), k


def test_updates_speculated_at_the_old_weight_decay_are_redone_at_the_written_one(backward_outlasts_host_folds):
    """As for the lr: a weight_decay the loop writes between backward and step (a weight-decay schedule) applies to
    that step, also to the host updates backward had already made."""

    def decay(optimizer, step):
        for group in optimizer.param_groups:
            group["weight_decay"] = 0.5 * (step + 1)

    speculated = []
    overlapped, _ = _train(True, 1.0, write=decay, clip=0.0, speculated=speculated)
    plain, _ = _train(True, 0.0, write=decay, clip=0.0)
    assert speculated[0] > 0
    for k, v in plain.items():
        assert torch.equal(overlapped[k], v), k


@pytest.mark.parametrize("offload", [False, True])
def test_an_lr_the_loop_set_once_comes_back_with_the_load(tmp_path, offload):
    """No scheduler: the loop sets the lr once (an epoch's end), the run saves, and a fresh engine that loads it
    trains on at that lr, as DeepSpeed's load puts the saved groups back: the same weights as the run that went on."""

    def make():
        extra = {"offload_optimizer": {"device": "cpu"}} if offload else {}
        model = make_model()
        return deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                    config=ds_config(2, "fp32", 2, **extra))[:2]

    def train(engine, batches):
        for x, y in batches:
            engine.backward(engine(x.to(engine.device), y.to(engine.device)).loss)
            engine.step()

    batches = make_batches(STEPS, 2)
    engine, optimizer = make()
    train(engine, batches[:1])
    for group in optimizer.param_groups:
        group["lr"] = 3e-3  # from the config's 1e-3, once
    train(engine, batches[1:2])
    engine.save_checkpoint(tmp_path)
    train(engine, batches[2:])
    went_on = engine.full_state_dict()
    engine.close()
    resumed, resumed_optimizer = make()
    resumed.load_checkpoint(tmp_path)
    assert [g["lr"] for g in resumed_optimizer.param_groups] == [3e-3]
    train(resumed, batches[2:])
    for k, v in went_on.items():
        assert torch.equal(resumed.full_state_dict()[k], v), k
    resumed.close()

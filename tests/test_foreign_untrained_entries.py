"""`engine.load_checkpoint` of a DeepSpeed or DCP checkpoint matches the model's frozen parameters and persistent
buffers one for one, as `load_state_dict(strict=True)` would: a buffer the checkpoint saved that the model does not
keep, a buffer of the model the checkpoint lacks, one of another shape, and a parameter frozen in the run but trained
now are each one line, before anything changes (tests/fixtures/deepspeed/2_2_fp32 and dcp/model_optim, both of the
Tiny model with its `mix` buffer and frozen `norm.weight`)."""

from __future__ import annotations

import pytest
import torch
from test_deepspeed_resume import ds_fixtures

from checkpoints.deepspeed_pickle import load_pickle
from checkpoints.source import CheckpointError
from deepspeed_crafting import crafted
from helpers import FIXTURES

SAVES = {"deepspeed": FIXTURES / "deepspeed" / "2_2_fp32", "dcp": FIXTURES / "dcp" / "model_optim"}


def _engine(model: torch.nn.Module, stage: int):
    """The fixtures' training setup around `model`, its norm.weight frozen unless the model trains it."""
    import zero_core.deepspeed as deepspeed

    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=cfg)
    return engine


def _tiny(change: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = ds_fixtures.Tiny()
    model.norm.weight.requires_grad_(change == "frozen now trained")
    if change == "buffer not kept":  # the model rebuilds `mix` itself: not part of its state dict
        mix = model.mix
        del model._buffers["mix"]
        model.register_buffer("mix", mix, persistent=False)
    elif change == "buffer not saved":
        model.register_buffer("scale", torch.full((3,), 2.0))
    elif change == "buffer shape":
        model.mix = torch.linspace(0.5, 1.5, 5)
    return model


def _refuses(change: str, source: str, *words: str, stage: int = 2) -> None:
    engine = _engine(_tiny(change), stage)
    before = {k: v.clone() for k, v in engine.full_state_dict().items()}
    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(SAVES[source])
    line = str(e.value)
    assert "\n" not in line and all(w in line for w in words), line
    after = engine.full_state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # refused before anything changed
    engine.close()


@pytest.mark.parametrize("source", list(SAVES))
def test_a_saved_buffer_the_model_does_not_keep_is_refused_not_dropped(source):
    _refuses("buffer not kept", source, "it saved mix (7,)", "not a parameter or a persistent buffer")


@pytest.mark.parametrize("source", list(SAVES))
def test_a_buffer_of_the_model_the_checkpoint_lacks_is_refused_not_left_as_initialised(source):
    _refuses("buffer not saved", source, "its buffer scale (3,) is not in the checkpoint", "persistent=False")


@pytest.mark.parametrize("source, stage", [("deepspeed", 2), ("dcp", 3)])
def test_a_buffer_of_another_shape_is_one_line_before_anything_changes(source, stage):
    _refuses("buffer shape", source, "mix is (7,) in the checkpoint but (5,) in the model", stage=stage)


@pytest.mark.parametrize("source", list(SAVES))
def test_a_parameter_frozen_in_the_run_but_trained_now_is_one_line(source):
    _refuses("frozen now trained", source, "norm.weight is trained by this model but was frozen",
             "load_optimizer_states=False")


def test_a_save_without_frozen_parameters_keeps_the_models_and_says_so(tmp_path, capsys):
    """DeepSpeed's save_checkpoint(exclude_frozen_parameters=True) at ZeRO-2: no frozen_param_shapes, fragments or
    module entry for norm.weight (the model's own value is kept, as a LoRA-style resume needs), and a note says so."""
    tag = crafted(tmp_path, "2_2_fp32")
    path = tag / "mp_rank_00_model_states.pt"
    state = load_pickle(path, mmap=False)
    for key in ("module", "frozen_param_shapes", "frozen_param_fragments"):
        state[key].pop("norm.weight")
    torch.save(state, path)
    model = _tiny("")
    own = model.norm.weight.detach().clone()
    engine = _engine(model, 2)
    engine.load_checkpoint(tag.parent)
    assert torch.equal(engine.full_state_dict()["norm.weight"], own)
    assert "holds no frozen parameter norm.weight (saved without frozen parameters)" in capsys.readouterr().out
    engine.close()


class _WithExtraState(torch.nn.Module):
    """A submodule whose state dict holds a plain object (`_extra_state`), as TransformerEngine's layers keep."""

    def get_extra_state(self):
        return {"recipe": "none"}

    def set_extra_state(self, state) -> None:
        pass


def test_a_modules_extra_state_is_not_taken_for_a_missing_buffer():
    model = _tiny("")
    model.extra = _WithExtraState()
    engine = _engine(model, 2)
    folder, _ = engine.load_checkpoint(SAVES["deepspeed"])
    assert engine.global_steps == 2
    assert folder == str(SAVES["deepspeed"] / "global_step2" / "mp_rank_00_model_states.pt")
    engine.close()

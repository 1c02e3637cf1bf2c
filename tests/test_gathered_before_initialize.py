"""GatheredParameters on a model built inside zero.Init before initialize, as DeepSpeed-Chat's and Hugging Face's
ZeRO-3 loading use it: inside, the parameters hold eager construction's values; what the modifier rank wrote
survives initialize on every rank, over several contexts; a meta parameter nobody recorded is refused in one
line."""

from __future__ import annotations

import pytest
import torch

import zero_core
import zero_core.deepspeed as deepspeed
from dist_harness import run_ranks

CONFIG = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def _model() -> torch.nn.Module:
    torch.manual_seed(5)  # an embedding's padding row is written through a view: the recording holds it
    return torch.nn.Sequential(torch.nn.Embedding(11, 6, padding_idx=0), torch.nn.Linear(6, 6),
                               torch.nn.Linear(6, 3))


def _load_before_initialize(rank: int, world: int) -> dict:
    eager = {k: v.clone() for k, v in _model().state_dict().items()}
    with zero_core.init_context(CONFIG):
        model = _model()
    with deepspeed.zero.GatheredParameters(list(model[1].parameters()), modifier_rank=0):
        inside = {k: v.clone() for k, v in model.state_dict().items()}
        if rank == 0:
            model[1].weight.data.fill_(0.5)
            model[1].bias.data[0] = 2.0  # a partial write: the rest stays as built
    last = world - 1  # a later context, another modifier: initialize itself would broadcast rank 0's values
    with deepspeed.zero.GatheredParameters(list(model[2].parameters()), modifier_rank=last):
        if rank == last:
            model[2].load_state_dict({"weight": torch.full((3, 6), -1.0), "bias": torch.zeros(3)})
    engine = zero_core.initialize(model, CONFIG)
    return {"eager": eager, "inside": inside, "full": engine.full_state_dict()}


def _check(got: dict) -> None:
    eager, inside, full = got["eager"], got["inside"], got["full"]
    assert all(torch.equal(inside[k], eager[k]) for k in eager)
    assert torch.equal(full["0.weight"], eager["0.weight"])
    assert torch.equal(full["1.weight"], torch.full((6, 6), 0.5))
    assert full["1.bias"][0] == 2.0 and torch.equal(full["1.bias"][1:], eager["1.bias"][1:])
    assert torch.equal(full["2.weight"], torch.full((3, 6), -1.0)) and not full["2.bias"].any()


def test_writes_before_initialize_reach_the_engine():
    _check(_load_before_initialize(0, 1))


@pytest.mark.slow
def test_the_modifier_ranks_writes_reach_every_ranks_shards():
    _check(run_ranks(_load_before_initialize, 2))  # each rank wrote one module


def test_a_meta_parameter_nobody_recorded_is_refused_in_one_line():
    with torch.device("meta"):
        layer = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="did not record") as e:
        with deepspeed.zero.GatheredParameters(list(layer.parameters()), modifier_rank=0):
            pass
    assert "\n" not in str(e.value)

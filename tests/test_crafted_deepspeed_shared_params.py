"""A DeepSpeed model-states file whose `shared_params` ties a trained parameter to a name with no data of its own
(a missing name, itself, another alias): the parameter keeps its own fp32 master, as DeepSpeed's zero_to_fp32
keeps it, instead of being left out of the output with a success."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from checkpoints.deepspeed_source import DeepSpeedSource
from checkpoints.source import full_state_dict
from deepspeed_crafting import crafted, resave
from helpers import FIXTURES

MODEL = "mp_rank_00_model_states.pt"


@pytest.mark.parametrize(
    "shared",
    [
        {"head.weight": "emb.weight", "lin1.weight": "ghost"},  # tied to a name the checkpoint does not hold
        {"head.weight": "emb.weight", "lin1.weight": "lin1.weight"},  # tied to itself
        {"head.weight": "emb.weight", "lin1.weight": "head.weight"},  # tied to another alias
    ],
)
def test_a_parameter_tied_to_no_data_keeps_its_own(tmp_path, shared):
    tag = crafted(tmp_path, "1_2_fp32")
    resave(tag / MODEL, shared_params=shared)
    state = full_state_dict(DeepSpeedSource(tag))
    expected = load_file(FIXTURES / "deepspeed" / "1_2_fp32" / "expected_fp32.safetensors")
    assert sorted(state) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name

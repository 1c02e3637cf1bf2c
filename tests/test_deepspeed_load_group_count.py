"""A DeepSpeed checkpoint's optimizer states go back into an optimizer of the same number of param groups, or are
refused in one line before the load changes anything (DeepSpeed's own load refuses another number of groups too);
the weights alone still load (load_optimizer_states=False)."""

from __future__ import annotations

import pytest
import torch

from checkpoints.source import CheckpointError
from test_deepspeed_resume import GROUPED, ZERO, _engine


@pytest.mark.parametrize("source, groups", [(ZERO[2], True), (GROUPED, False)])
def test_optimizer_states_of_another_number_of_groups_are_refused_before_anything_changes(source, groups):
    engine = _engine(2, groups=groups)
    before = {k: v.clone() for k, v in engine.full_state_dict().items()}
    with pytest.raises(CheckpointError, match="parameter group") as refused:
        engine.load_checkpoint(source)
    assert "\n" not in str(refused.value)
    assert engine.global_steps == 0
    assert all(torch.equal(before[k], v) for k, v in engine.full_state_dict().items())
    engine.load_checkpoint(source, load_optimizer_states=False)  # the weights alone
    assert any(not torch.equal(before[k], v) for k, v in engine.full_state_dict().items())

"""What a TrainerCallback gets as `optimizer` and `lr_scheduler` under ZeroTrainer answers `state_dict()` as under
Trainer with DeepSpeed 0.19.8 (2 CPU ranks, stage 3, tests/fixtures/make_trainer_state_dict_fixtures.py): the
scheduler's state is DeepSpeed's (Trainer's linear schedule as a LambdaLR's, the config's WarmupDecayLR as
`{"last_batch_iteration": n}`), the optimizer's holds this rank's states, and the optimizer is a torch Optimizer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from dist_harness import run_ranks  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from make_trainer_state_dict_fixtures import peek  # noqa: E402

RECORDED = json.loads((FIXTURES / "trainer_state_dicts.json").read_text())

pytestmark = pytest.mark.slow  # spawned ranks


@pytest.mark.parametrize("schedule", ["trainer", "config"])
def test_callbacks_see_the_optimizer_and_scheduler_states(tmp_path, schedule):
    real = RECORDED[schedule]
    got = run_ranks(peek, 2, False, schedule, str(tmp_path))
    assert got["scheduler_state"] == real["scheduler_state"]
    assert got["optimizer_state_held"] is True and got["is_optimizer"] is True
    assert got["logged_lrs"] == pytest.approx(real["logged_lrs"], abs=1e-12)

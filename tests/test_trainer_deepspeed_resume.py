"""ZeroTrainer resumes a checkpoint-N that Hugging Face's Trainer wrote with real DeepSpeed (0.19.8, 2 CPU ranks,
tests/fixtures/make_hf_trainer_fixtures.py): the same script with one changed import continues the same losses
and ends on DeepSpeed's weights, on the run's 2 ranks and on 1 rank at another stage."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import trainer_workers as tw  # noqa: E402
from dist_harness import run_ranks  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from make_hf_trainer_fixtures import STEPS, ds_config  # noqa: E402

pytestmark = pytest.mark.slow  # spawned ranks: outside the fast tier (-m 'not slow')


def _resume(tmp_path: Path, fixture: str, world: int, stage: int) -> tuple[dict, dict]:
    folder = FIXTURES / "hf_trainer_deepspeed" / fixture
    expected = json.loads((folder / "expected.json").read_text())
    checkpoint = tmp_path / "checkpoint-3"
    shutil.copytree(folder / "checkpoint-3", checkpoint)
    config = ds_config(stage, expected.get("trainer_schedule", False))
    extra = {"deepspeed": config, "max_steps": STEPS, "save_strategy": "no", "eval_strategy": "no"}
    got = run_ranks(tw.run, world, "zero", "gpt2", None, str(tmp_path / "out"), extra, str(checkpoint))
    return got, expected


def _weights_match(got: dict, fixture: str, atol: float) -> None:
    from safetensors.torch import load_file

    final = load_file(str(FIXTURES / "hf_trainer_deepspeed" / fixture / "expected_final.safetensors"))
    assert set(final) == set(got) - {"lm_head.weight"}  # the tied head is stored once
    for name, value in final.items():
        assert (got[name] - value).abs().max() <= atol, name


@pytest.mark.parametrize("fixture, stage", [("2", 2), ("3", 3), ("2_trainer_schedule", 2)])
def test_the_run_continues_on_its_own_ranks_and_stage(tmp_path, fixture, stage):
    """"2_trainer_schedule": Trainer's own linear schedule, saved by DeepSpeed as a torch LambdaLR's state."""
    got, expected = _resume(tmp_path, fixture, 2, stage)
    done = expected["saved_after_micro_steps"]
    assert len(got["losses"]) == len(expected["losses"]) - done  # Trainer skipped the batches already trained on
    assert got["losses"] == pytest.approx(expected["losses"][done:], rel=1e-5)
    # Trainer's log, the saved steps' entries then the resumed ones: the lr of the next update, as with DeepSpeed
    assert got["logged_lrs"] == pytest.approx(expected["learning_rates"], abs=1e-12)
    _weights_match(got["weights"], fixture, 1e-4)  # after 5 Adam updates at lr 1e-2


def test_the_run_continues_on_one_rank_at_another_stage(tmp_path):
    got, expected = _resume(tmp_path, "3", 1, 1)  # the same global batches: tw's data order is sequential
    done = expected["saved_after_micro_steps"]
    assert got["losses"] == pytest.approx(expected["losses"][done:], rel=1e-5)
    _weights_match(got["weights"], "3", 1e-4)

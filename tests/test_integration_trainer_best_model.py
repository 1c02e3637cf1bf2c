"""`load_best_model_at_end` under ZeroTrainer as under Trainer with DeepSpeed 0.19.8 (2 CPU ranks, stage 3,
tests/fixtures/make_trainer_best_model_fixtures.py): after train() the weights are the best checkpoint's, and so
are the optimizer's lrs, the scheduler's state and the engine's step (DeepSpeed loads the whole checkpoint);
`save_only_model=True` with `load_best_model_at_end=True` is refused when the trainer is built, as transformers
refuses it with DeepSpeed (the folders hold no engine states to load)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import trainer_workers as tw  # noqa: E402
from dist_harness import run_ranks  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from make_trainer_best_model_fixtures import best_run  # noqa: E402

RECORDED = json.loads((FIXTURES / "trainer_best_model.json").read_text())


@pytest.mark.slow  # spawned ranks
@pytest.mark.parametrize("schedule", ["config", "trainer"])
def test_the_best_checkpoint_comes_back_with_its_optimizer_and_schedule(tmp_path, schedule):
    real = RECORDED[schedule]
    got = run_ranks(best_run, 2, False, schedule, str(tmp_path))
    assert got["best"] == real["best"] == "checkpoint-4"
    assert got["evals"] == pytest.approx(real["evals"], abs=1e-5)
    assert got["weight_sums"].keys() == real["weight_sums"].keys()
    for name, total in real["weight_sums"].items():
        assert got["weight_sums"][name] == pytest.approx(total, abs=2e-4), name
    assert got["lrs"] == pytest.approx(real["lrs"], abs=1e-9)
    assert got["engine_steps"] == real["engine_steps"]
    if schedule == "config":  # DeepSpeed's {"last_batch_iteration": n}
        assert got["scheduler_state"] == real["scheduler_state"]
    else:  # a LambdaLR's: the counters and the lr it last set
        for key in ("last_epoch", "_step_count", "_last_lr"):
            assert got["scheduler_state"][key] == pytest.approx(real["scheduler_state"][key]), key


def test_save_only_model_with_load_best_model_at_end_is_refused(tmp_path):
    from zero_core.integrations.transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), deepspeed=tw.zero3_auto_config("config"), use_cpu=True,
                             report_to=[], save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2,
                             save_only_model=True, load_best_model_at_end=True)
    with pytest.raises(ValueError, match="drop save_only_model or load_best_model_at_end"):
        Trainer(model=tw.tiny_model("gpt2"), args=args, train_dataset=tw.Samples("gpt2", 4, 1),
                eval_dataset=tw.Samples("gpt2", 4, 2))


def test_a_best_checkpoint_without_engine_states_is_refused_not_skipped(tmp_path):
    """A best folder holding only the model's files (its engine checkpoint removed) must not leave the last weights
    in place silently, as the engine's own load of an empty folder would."""
    from zero_core.integrations.transformers_best_model import load_best

    class Engine:
        loaded = False

        def load_checkpoint(self, folder):
            self.loaded = True

    (tmp_path / "model.safetensors").write_bytes(b"")
    engine = Engine()
    with pytest.raises(ValueError, match="holds no zbench or DeepSpeed checkpoint"):
        load_best(engine, str(tmp_path))
    assert not engine.loaded
